"""AgentEvol's section of the config (``agentevol:``) and its checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from agentgym.trainers.config_checks import clipped_family_only


@dataclass(frozen=True)
class AgentEvolSettings:
    """AgentEvol's explore + learn iterations (``algo: agentevol``; ``trainers/agentevol/``)."""

    SECTION: ClassVar[str] = "agentevol"
    """Its key in the config (``agentevol.iterations``)."""
    FLAT_PREFIX: ClassVar[str] = "evol_"
    """Earlier versions took these fields as top-level keys, this prefix + the field's name
    (``evol_iterations``; still accepted)."""

    iterations: int = 2
    """Explore + learn iterations after behaviour cloning (``steps`` is not used)."""
    reward_threshold: float | None = None
    """Keep explored episodes with reward ≥ this (filtered BC); None weighs each by its reward."""

    def problems(self, config: Any) -> list[str]:
        """What stops ``config`` from running AgentEvol."""
        problems = clipped_family_only(config)
        if self.iterations < 0:
            problems.append("agentevol.iterations must be at least 0 (0: behaviour cloning only)")
        return problems
