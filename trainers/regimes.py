"""The training regimes, each a step you can read top to bottom.

* :func:`behaviour_cloning`: the warm start (and AgentEvol's first stage);
* :class:`ClippedRL`: the clipped-ratio family (BAPO, GRPO, DAPO, Dr. GRPO, RLOO,
  REINFORCE++, PPO-clip), which differ only in registry entries;
* AgentEvol (``agentevol/``) and Critique-RL (``critique_rl/``) live in their own folders,
  each with its config section; the clipped update they share is in ``update.py``.

A regime gets the trainer as a :class:`~agentgym.trainers.context.TrainingContext`
(config, learner, collector, run folder, and the services every regime uses:
demonstrations and greedy play, ``services.py``) and returns the step's metrics record.
"""

from __future__ import annotations

import random
import time
from typing import Any

from agentgym.agents.tokens import sampled_versions
from agentgym.trainers.algorithms import weighted_nll
from agentgym.trainers.batch import collate, token_record
from agentgym.trainers.context import TrainingContext
from agentgym.trainers.figures import rollout_stats, seconds_since
from agentgym.trainers.learner import Learner, PerTokenLoss
from agentgym.trainers.update import update_policy
from agentgym.trajectory import Trajectory

# ----- behaviour cloning ---------------------------------------------------------------------


def nll(learner: Learner) -> PerTokenLoss:
    """Per-token ``-w·log π``: the likelihood of the demonstrations at temperature 1."""
    return lambda micro: weighted_nll(learner.logprobs(micro, temperature=1.0)[0], micro.advantages)


def behaviour_cloning(trainer: TrainingContext, step: int, demos: list[dict[str, Any]]) -> dict[str, Any]:
    """One optimizer step of likelihood on a minibatch of ``demos`` (token records: what the
    regime clones, ``regime.demonstrations()``)."""
    chosen = random.Random(trainer.config.seed * 7919 + step).sample(
        demos, min(trainer.config.bc_batch_size, len(demos))
    )
    start = time.perf_counter()
    batch = trainer.minibatch(collate(chosen, [1.0] * len(chosen), trainer.pad_id))
    loss = trainer.learner.optimize(batch, nll(trainer.learner))
    figures = {"loss": loss, "grad_norm": trainer.learner.grad_norm, "episodes": len(chosen)}
    return {"step": step, "phase": "bc", **figures, "update_s": seconds_since(start)}


# ----- the clipped family --------------------------------------------------------------------


class ClippedRL:
    """Collect groups of episodes, turn their rewards into advantages, update the policy."""

    def __init__(self, trainer: TrainingContext) -> None:
        self.trainer = trainer

    @staticmethod
    def rl_steps(config: Any) -> int:
        return config.steps

    @staticmethod
    def describe(record: dict[str, Any]) -> str:
        """A step's words on the progress bar."""
        return f"rl  success {record['success_rate']:.2f} turns≤{record['max_turns']}"

    def step(self, step: int) -> dict[str, Any]:
        """Take this step's episodes (sync: play them now; async: those played during the
        last update), start playing the next step's (async), then update."""
        trainer, config = self.trainer, self.trainer.config
        trainer.learner.set_learning_rate(config.rl_learning_rate or config.learning_rate)
        if config.kl_coef:
            trainer.learner.take_reference(trainer.run_dir.path / "reference.pt")
        if config.curriculum != "all" and config.bc_steps and trainer.collector.expert_turns is None:
            trainer.collector.expert_turns = trainer.demos.turns()
        if config.curriculum == "unsolved" and trainer.collector.solved is None:
            trainer.collector.solved = trainer.greedy.solved_at_start(step)
        start, horizon = time.perf_counter(), trainer.horizon(step)
        episodes, samples, figures = trainer.collector.collect(step, trainer.version, horizon)
        record = {"step": step, "phase": "rl", "mode": config.mode, "max_turns": horizon}
        record |= rollout_stats(episodes) | figures | {"wait_s": seconds_since(start)}
        if config.mode == "async" and step < trainer.total_steps:
            trainer.collector.launch(step + 1, trainer.horizon(step + 1))
        start = time.perf_counter()
        if samples:
            batch = collate(
                [token_record(s.trajectory) for s in samples], [s.advantage for s in samples], trainer.pad_id
            )
            # Async: the update runs in a thread while the event loop plays the next step's episodes.
            sampled_now = all(sampled_by(s.trajectory, trainer.version) for s in samples)
            record |= trainer.in_background(update_policy, trainer, batch, config.kl_coef, sampled_now)
        else:
            record |= {"updates": [], "skipped": "no episode to train on this step"}
        return record | {"update_s": seconds_since(start)}

    def demonstrations(self) -> list[dict[str, Any]]:
        """What behaviour cloning clones: the expert's episodes (``ExpertDemonstrations``)."""
        return self.trainer.demos.records()

    def evaluate(self, step: int, split: str = "test") -> dict[str, Any]:
        """Greedy episodes on held-out tasks (``GreedyPlay.evaluate``)."""
        return self.trainer.greedy.evaluate(step, split)


# ----- figures ---------------------------------------------------------------------------------


def sampled_by(trajectory: Trajectory, version: int) -> bool:
    """Whether the weights of ``version`` sampled every agent token of ``trajectory`` (False
    when the generator does not report versions)."""
    versions = sampled_versions(trajectory.versions, trajectory.loss_mask)
    return bool(versions) and all(v == version for v in versions)
