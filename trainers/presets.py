"""The ``--algo`` names: every preset names an advantage estimator and a clip rule (functions
registered where they are defined, in :mod:`agentgym.trainers.algorithms`), the recipe that trains with them, and the
config defaults its paper uses. Plain data, so the CLI's help and the docs read it without
loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CLIPPED_RL = "agentgym.trainers.regimes:ClippedRL"
"""The clipped family's regime: collect groups, advantages, a clipped update."""


@dataclass(frozen=True)
class Preset:
    summary: str
    """One line for ``agentgym train --help`` and the docs: what the name promises."""
    regime: str
    """The training regime's class by import path (``module:Class``, resolved when a run
    starts, so the trainer names no regime): :data:`CLIPPED_RL` or a regime's own folder."""
    advantage: str = "grpo"
    clip_rule: str = "fixed"
    defaults: dict[str, Any] = field(default_factory=dict)
    """Config fields its paper sets (dotted for nested configs); the user's values win."""
    settings: str | None = None
    """The regime's own config section by import path (``module:Class``: a frozen dataclass
    with ``SECTION``, its key in the config, and ``problems(config)``, its checks). The config
    finds its sections here, so a new regime is its folder plus a preset."""


PRESETS: dict[str, Preset] = {
    "bapo": Preset(
        "BAPO (arXiv 2510.18927): GRPO advantages, ratio bounds searched every update, dual-clip 3",
        CLIPPED_RL,
        clip_rule="bapo",
        defaults={"dual_clip": 3.0},
    ),
    "grpo": Preset(
        "GRPO (arXiv 2402.03300): group-normalised outcome advantages, PPO clip 0.2, "
        "per-episode mean of token losses, KL 0.04 to the policy at the start of RL",
        CLIPPED_RL,
        defaults={"loss_aggregation": "seq-mean", "kl_coef": 0.04},
    ),
    "dapo": Preset(
        "DAPO (arXiv 2503.14476): clip-higher 0.28, dynamic sampling that refills the batch, token mean",
        CLIPPED_RL,
        defaults={"clip.eps_high": 0.28, "dynamic_sampling": True, "loss_aggregation": "token-mean"},
    ),
    "dr-grpo": Preset(
        "Dr. GRPO (arXiv 2503.20783): GRPO without std or length normalisation",
        CLIPPED_RL,
        advantage="grpo-unscaled",
        defaults={"loss_aggregation": "seq-sum-norm"},
    ),
    "gigpo": Preset(
        "GiGPO (arXiv 2505.10978): GRPO episode advantage + step advantage over repeated states (ω 1, γ 0.95)",
        CLIPPED_RL,
        advantage="gigpo",
    ),
    "rloo": Preset("RLOO: leave-one-out group baseline, PPO clip 0.2", CLIPPED_RL, advantage="rloo"),
    "reinforce++": Preset(
        "REINFORCE++-baseline (arXiv 2501.03262): group mean subtracted, then batch whitening; PPO clip",
        CLIPPED_RL,
        advantage="reinforce++-baseline",
    ),
    "ppo": Preset(
        "PPO-clip on batch-whitened outcome rewards: no value network, no GAE",
        CLIPPED_RL,
        advantage="batch-whitened",
    ),
    "agentevol": Preset(
        "AgentEvol (arXiv 2406.04151): behaviour cloning, then explore + reward-weighted learn",
        "agentgym.trainers.agentevol.regime:AgentEvol",
        settings="agentgym.trainers.agentevol.settings:AgentEvolSettings",
    ),
    "critique-rl": Preset(
        "Critique-RL (arXiv 2510.24320): two-stage RL of a critic, RLOO over its critiques, KL 0.01",
        "agentgym.trainers.critique_rl.regime:CritiqueRL",
        advantage="rloo",
        defaults={"kl_coef": 0.01},
        settings="agentgym.trainers.critique_rl.settings:CritiqueRLSettings",
    ),
}
"""``--algo`` names. AgentEvol and Critique-RL train in their own regimes."""


def algo_help() -> str:
    """The ``--algo`` help text: every name with what it is."""
    return "; ".join(f"{name}: {preset.summary}" for name, preset in PRESETS.items()) + ". Default: bapo."
