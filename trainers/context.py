"""What a training regime (``regimes.py``, ``agentevol/``, ``critique_rl/``) reads of the
trainer: the run (config, learner, collector, run folder, tasks), the services every regime
uses (``services.py``) and the loop's few hooks, written down so the regimes never import
the loop that runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agentgym.trainers.services import ExpertDemonstrations, GreedyPlay, ServiceContext
from agentgym.trainers.update import UpdateContext


class TrainingContext(ServiceContext, UpdateContext, Protocol):
    demos: ExpertDemonstrations
    """The expert's episodes (behaviour cloning, curricula, AgentEvol)."""
    greedy: GreedyPlay
    """Greedy play with the current weights (held-out evaluation, curricula)."""
    pad_id: int
    total_steps: int

    def horizon(self, step: int) -> int:
        """The turn limit of ``step`` (the schedule's)."""
        ...

    def in_background(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` off the event loop, which keeps playing episodes meanwhile."""
        ...
