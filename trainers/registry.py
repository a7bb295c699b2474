"""The algorithm registry: every ``--algo`` name is a :class:`Preset`, a row of this file.

A preset names an advantage estimator (how episodes become advantages), a clip rule (the
ratio bounds of the clipped policy loss), the recipe that trains with them, and the config
defaults its paper uses. The trainer looks things up here and never branches on a name.

Adding an algorithm: one function (an estimator below, a clip rule, or a recipe in
``recipes.py``) plus one entry here. Estimator and clip rule are independent config fields
(``advantage``, ``clip_rule``), so BAPO's clipping composes with any estimator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import Tensor

from agentgym.trainers.algorithms import (
    BapoSearch,
    bapo_bounds,
    discounted_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    step_advantages,
)
from agentgym.trainers.batch import agent_turns
from agentgym.trajectory import Trajectory

Advantage = float | list[float]
"""An episode's advantage: one number for every agent token, or one per agent turn."""
AdvantageEstimator = Callable[[Sequence[Trajectory], Tensor], list[Advantage]]
"""``f(episodes, group_ids [B]) -> one Advantage per episode``: whole episodes go in (per-turn
rewards and observations), so per-turn estimators such as GiGPO fit the same slot."""


def outcome(advantages: Callable[[Tensor, Tensor], Tensor]) -> AdvantageEstimator:
    """An estimator from a function of the episodes' outcome scores and group ids."""

    def estimate(episodes: Sequence[Trajectory], group_ids: Tensor) -> list[Advantage]:
        rewards = torch.tensor([float(e.score) for e in episodes])
        return advantages(rewards, group_ids).tolist()

    return estimate


def observations_before_replies(episode: Trajectory) -> list[str]:
    """The observation the agent answered at each of its turns: GiGPO's anchor states."""
    messages = episode.messages
    return [
        messages[i - 1]["content"] if i > 0 else ""
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and m.get("loss", True)
    ]


def gigpo(
    episodes: Sequence[Trajectory], group_ids: Tensor, *, omega: float = 1.0, gamma: float = 0.95
) -> list[Advantage]:
    """GiGPO: GRPO's episode advantage plus ``omega`` × the step advantage of each turn
    (:func:`~agentgym.trainers.algorithms.step_advantages`, returns discounted by ``gamma``);
    the paper's ω = 1, γ = 0.95. An episode whose turns cannot be matched to its tokens keeps
    the episode advantage alone."""
    episode_level = grpo_advantages(torch.tensor([float(e.score) for e in episodes]), group_ids).tolist()
    anchors = [observations_before_replies(e) for e in episodes]
    returns = [discounted_returns(list(e.rewards), gamma) for e in episodes]
    usable = [
        len(a) == len(r) == agent_turns(e.loss_mask or [])
        for e, a, r in zip(episodes, anchors, returns, strict=True)
    ]
    steps = step_advantages(
        [r if ok else [] for r, ok in zip(returns, usable, strict=True)],
        [a if ok else [] for a, ok in zip(anchors, usable, strict=True)],
        group_ids.tolist(),
    )
    return [
        [base + omega * step for step in turn] if ok else base
        for base, turn, ok in zip(episode_level, steps, usable, strict=True)
    ]


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": outcome(grpo_advantages),
    "grpo-unscaled": outcome(partial(grpo_advantages, normalize_std=False)),  # Dr. GRPO
    "rloo": outcome(rloo_advantages),
    "reinforce++-baseline": outcome(reinforce_pp_advantages),
    "batch-whitened": outcome(lambda rewards, _: reinforce_pp_advantages(rewards)),
    "gigpo": gigpo,
}


@dataclass(frozen=True)
class Prepass:
    """What a clip rule may look at before an update: this rank's share of the minibatch
    under the current weights (no gradient), and how to sum figures over ranks."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    reduce: Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Bounds:
    low: float
    high: float
    search: BapoSearch | None = None
    """BAPO: how its search over the whole minibatch (all ranks) ended, and the ρ reached."""


ClipRule = Callable[[Any, Callable[[], Prepass]], Bounds]
"""``rule(config, prepass) -> Bounds``; ``prepass()`` costs a forward, so only call it if needed."""


def fixed_bounds(config: Any, prepass: Callable[[], Prepass]) -> Bounds:
    """PPO ``[1-ε, 1+ε]``; DAPO's clip-higher when ``eps_high > eps_low``."""
    return Bounds(1 - config.clip.eps_low, 1 + config.clip.eps_high)


def bapo_search(config: Any, prepass: Callable[[], Prepass]) -> Bounds:
    """BAPO: bounds searched on the whole minibatch under the current weights."""
    data = prepass()
    search = bapo_bounds(data.logp, data.old_logp, data.advantages, data.mask, config.bapo, data.reduce)
    return Bounds(search.low, search.high, search)


CLIP_RULES: dict[str, ClipRule] = {"fixed": fixed_bounds, "bapo": bapo_search}


@dataclass(frozen=True)
class Preset:
    summary: str
    """One line for ``agentgym train --help`` and the docs: what the name promises."""
    recipe: str
    """``rl`` (the clipped family), ``agentevol`` or ``critique-rl`` (see ``recipes.py``)."""
    advantage: str = "grpo"
    clip_rule: str = "fixed"
    defaults: dict[str, Any] = field(default_factory=dict)
    """Config fields its paper sets (dotted for nested configs); the user's values win."""


PRESETS: dict[str, Preset] = {
    "bapo": Preset(
        "BAPO (arXiv 2510.18927): GRPO advantages, ratio bounds searched every update, dual-clip 3",
        "rl",
        clip_rule="bapo",
        defaults={"dual_clip": 3.0},
    ),
    "grpo": Preset(
        "GRPO (arXiv 2402.03300): group-normalised outcome advantages, PPO clip 0.2, "
        "per-episode mean of token losses, KL 0.04 to the policy at the start of RL",
        "rl",
        defaults={"loss_aggregation": "seq-mean", "kl_coef": 0.04},
    ),
    "dapo": Preset(
        "DAPO (arXiv 2503.14476): clip-higher 0.28, dynamic sampling that refills the batch, token mean",
        "rl",
        defaults={"clip.eps_high": 0.28, "dynamic_sampling": True, "loss_aggregation": "token-mean"},
    ),
    "dr-grpo": Preset(
        "Dr. GRPO (arXiv 2503.20783): GRPO without std or length normalisation",
        "rl",
        advantage="grpo-unscaled",
        defaults={"loss_aggregation": "seq-sum-norm"},
    ),
    "gigpo": Preset(
        "GiGPO (arXiv 2505.10978): GRPO episode advantage + step advantage over repeated states (ω 1, γ 0.95)",
        "rl",
        advantage="gigpo",
    ),
    "rloo": Preset("RLOO: leave-one-out group baseline, PPO clip 0.2", "rl", advantage="rloo"),
    "reinforce++": Preset(
        "REINFORCE++-baseline (arXiv 2501.03262): group mean subtracted, then batch whitening; PPO clip",
        "rl",
        advantage="reinforce++-baseline",
    ),
    "ppo": Preset(
        "PPO-clip on batch-whitened outcome rewards: no value network, no GAE",
        "rl",
        advantage="batch-whitened",
    ),
    "agentevol": Preset(
        "AgentEvol (arXiv 2406.04151): behaviour cloning, then explore + reward-weighted learn", "agentevol"
    ),
    "critique-rl": Preset(
        "Critique-RL (arXiv 2510.24320): two-stage RL of a critic, RLOO over its critiques, KL 0.01",
        "critique-rl",
        advantage="rloo",
        defaults={"kl_coef": 0.01},
    ),
}
"""``--algo`` names. AgentEvol and Critique-RL use their own recipes (``recipes.py``)."""


def algo_help() -> str:
    """The ``--algo`` help text: every name with what it is."""
    return "; ".join(f"{name}: {preset.summary}" for name, preset in PRESETS.items())
