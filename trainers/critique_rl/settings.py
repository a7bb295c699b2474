"""Critique-RL's section of the config (``critique_rl:``) and its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentgym.contract.errors import AgentGymError
from agentgym.registry import answer_key
from agentgym.trainers.config_checks import clipped_family_only


@dataclass(frozen=True)
class CritiqueRLSettings:
    """Critique-RL's stages (``algo: critique-rl``, env math; ``trainers/critique_rl/``)."""

    SECTION: ClassVar[str] = "critique_rl"
    """Its key in the config (``critique_rl.stage1_steps``)."""
    FLAT_PREFIX: ClassVar[str] = ""
    """Earlier versions took these fields as top-level keys, this prefix + the field's name
    (still accepted)."""

    stage1_steps: int = 2
    """Stage I steps (reward: the verdict), after the ``bc_steps`` warm start on synthetic
    critiques; ``steps`` is not used by critique-rl."""
    stage2_steps: int = 2
    """Stage II steps (reward: the refined answer + ``stage2_beta`` x the verdict's)."""
    critiques_per_answer: int = 4
    """Critiques sampled per actor answer (the RLOO group); ``tasks_per_step`` problems, one
    answer each, per step."""
    stage2_beta: float = 0.2
    """β1, the weight of the verdict reward in Stage II."""
    stage2_kl_coef: float = 0.05
    """Weight of the k3 KL to the Stage-I critic in Stage II (0 disables it)."""

    def problems(self, config: Any) -> list[str]:
        """What stops ``config`` from training a critic."""
        problems = clipped_family_only(config)
        try:
            answer_key(config.env)
        except (AgentGymError, ValueError) as exc:
            problems.append(f"critique-rl trains on question-and-answer problems (env math): {exc}")
        if not config.lora or config.generator != "hf":
            problems.append(
                "critique-rl needs lora: true and generator: hf (the actor is the base model, adapters off)"
            )
        if self.critiques_per_answer < 2:
            problems.append(
                "critique_rl.critiques_per_answer must be at least 2 (RLOO compares the critiques of one answer)"
            )
        if self.stage1_steps < 0 or self.stage2_steps < 0:
            problems.append("critique_rl.stage1_steps and critique_rl.stage2_steps must be at least 0")
        return problems
