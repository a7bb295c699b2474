"""What a training regime (``regimes.py``, ``agentevol/``, ``critique_rl/``) reads of the trainer: the
context the loop (:class:`~agentgym.trainers.loop.Trainer`) provides, written down so the
regimes never import the loop that runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agentgym.run_folder import RunDir
from agentgym.trainers.collector import Collector
from agentgym.trainers.update import UpdateContext


class TrainingContext(UpdateContext, Protocol):
    collector: Collector
    run_dir: RunDir
    url: str
    """The env server's URL."""
    tokenizer: Any
    pad_id: int
    train_tasks: list[str]
    validation_tasks: list[str]
    test_tasks: list[str]
    total_steps: int
    regime: Any
    """The regime itself (behaviour cloning asks it for demonstrations)."""

    def horizon(self, step: int) -> int:
        """The turn limit of ``step`` (the schedule's)."""
        ...

    def complete(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to its end on the trainer's event loop."""
        ...

    def in_background(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` off the event loop, which keeps playing episodes meanwhile."""
        ...
