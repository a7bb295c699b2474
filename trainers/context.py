"""What a training regime (``regimes.py``, ``agentevol/``, ``critique_rl/``) gets of a run:
the pieces the trainer has set up (config, learner, collector, run folder, tasks), the
services every regime uses (``services.py``) and the few operations regimes share. The
trainer builds one when the model, the generator and the env are up, and keeps to itself
the loop, the checkpoints, the metrics and the report; a regime never sees the trainer."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from agentgym.records.run_folder import RunDir
from agentgym.trainers.batch import TokenBatch
from agentgym.trainers.collector import Collector
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from agentgym.trainers.schedules import HorizonSchedule
from agentgym.trainers.services import ExpertDemonstrations, GreedyPlay


@dataclass
class TrainingContext:
    """The run as a regime sees it; it also serves as the services' ``ServiceContext`` and the
    update's ``UpdateContext`` (the narrower views those modules are typed against)."""

    config: Any
    learner: Learner
    collector: Collector
    dp: DataParallel
    run_dir: RunDir
    url: str
    """The env server's URL."""
    tokenizer: Any
    pad_id: int
    train_tasks: list[str]
    validation_tasks: list[str]
    test_tasks: list[str]
    total_steps: int
    schedule: HorizonSchedule
    runner: asyncio.Runner
    """The run's one event loop (a vLLM engine stays bound to the loop it started on)."""
    demos: ExpertDemonstrations = field(init=False)
    """The expert's episodes (behaviour cloning, curricula, AgentEvol)."""
    greedy: GreedyPlay = field(init=False)
    """Greedy play with the current weights (held-out evaluation, curricula)."""

    def __post_init__(self) -> None:
        self.demos, self.greedy = ExpertDemonstrations(self), GreedyPlay(self)

    @property
    def version(self) -> int:
        """The policy weights version: training steps done (seeds the minibatch order)."""
        return self.learner.policy.weights_version

    def horizon(self, step: int) -> int:
        """Max turns at ``step``: the schedule's, counted from the first RL step."""
        return self.schedule.horizon_at(max(1, step - self.config.bc_steps))

    def minibatch(self, batch: TokenBatch) -> TokenBatch:
        """``batch`` as one optimizer step's minibatch: its token weights fixed on all of it."""
        return batch.weighted(self.config.loss_aggregation, self.config.norm_tokens)

    def complete(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to its end on the run's event loop."""
        return self.runner.run(coroutine)

    def in_background(self, work: Callable[..., Any], *args: Any) -> Any:
        """Run ``work`` here in sync mode; in async mode in a worker thread, so the event
        loop goes on playing the episodes of the next step meanwhile."""
        if self.collector.pending is None:
            return work(*args)
        return self.complete(asyncio.to_thread(work, *args))
