"""The loss settings a training config holds: the clip bounds, BAPO's bound search and the
loss aggregations by name. Torch-free, so a config is read and checked (``--print-config``)
without loading the math that uses them (:mod:`agentgym.trainers.algorithms`)."""

from __future__ import annotations

from dataclasses import dataclass

AGGREGATIONS = ("token-mean", "seq-mean", "seq-sum-norm")
"""How per-token losses are weighted over a minibatch (:func:`~agentgym.trainers.algorithms.token_weights`)."""


@dataclass(frozen=True)
class ClipConfig:
    eps_low: float = 0.2
    """PPO/DAPO: c_low = 1 - eps_low."""
    eps_high: float | None = None
    """c_high = 1 + eps_high. None: the algorithm's (PPO 0.2; DAPO's clip-higher 0.28)."""


@dataclass(frozen=True)
class BapoConfig:
    """BAPO's bound search (arXiv 2510.18927); defaults are the paper's (§5.1)."""

    rho0: float = 0.4
    """Target positive share ρ0 of the clipped objective, ρ = P/(P+N)."""
    low_start: float = 0.6
    """a⁻: c_low's start."""
    low_max: float = 0.9
    """b⁻: c_low's ceiling."""
    high_start: float = 1.2
    """a⁺: c_high's start."""
    high_max: float = 3.0
    """b⁺: c_high's ceiling."""
    high_step: float = 0.05
    """δ1: c_high's step."""
    low_step: float = 0.02
    """δ2: c_low's step."""

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.rho0 < 1:
            problems.append("bapo.rho0 must be in (0, 1)")
        if self.high_step <= 0 or self.low_step <= 0:
            problems.append("bapo.high_step and bapo.low_step must be positive (the search must move)")
        if not 0 < self.low_start <= self.low_max <= 1:
            problems.append("bapo bounds need 0 < low_start <= low_max <= 1")
        if not 1 <= self.high_start <= self.high_max:
            problems.append("bapo bounds need 1 <= high_start <= high_max")
        if problems:
            raise ValueError("; ".join(problems))
