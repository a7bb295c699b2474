"""The training regimes, each a step you can read top to bottom.

* :func:`behaviour_cloning`: the warm start (and AgentEvol's first stage);
* :class:`ClippedRL`: the clipped-ratio family (BAPO, GRPO, DAPO, Dr. GRPO, RLOO,
  REINFORCE++, PPO-clip), which differ only in registry entries;
* AgentEvol (``agentevol/``) and Critique-RL (``critique_rl/``) live in their own folders,
  each with its config section; the clipped update they share is in ``update.py``.

A regime gets a :class:`~agentgym.trainers.context.TrainingContext`, not the trainer:
the run's config, learner, collector, run folder and tasks, and the services every regime
uses (demonstrations and greedy play, ``services.py``); it returns the step's metrics record.
"""

from __future__ import annotations

import random
import time
from typing import Any

from agentgym.agents.tokens import sampled_versions
from agentgym.records.trajectory import Trajectory
from agentgym.trainers.algorithms import weighted_nll
from agentgym.trainers.batch import collate, token_record
from agentgym.trainers.context import TrainingContext
from agentgym.trainers.figures import rollout_stats, seconds_since
from agentgym.trainers.learner import Learner, PerTokenLoss
from agentgym.trainers.update import update_policy

# ----- behaviour cloning ---------------------------------------------------------------------


def nll(learner: Learner) -> PerTokenLoss:
    """Per-token ``-w·log π``: the likelihood of the demonstrations at temperature 1."""
    return lambda micro: weighted_nll(learner.logprobs(micro, temperature=1.0)[0], micro.advantages)


def behaviour_cloning(run: TrainingContext, step: int, demos: list[dict[str, Any]]) -> dict[str, Any]:
    """One optimizer step of likelihood on a minibatch of ``demos`` (token records: what the
    regime clones, ``regime.demonstrations()``)."""
    chosen = random.Random(run.config.seed * 7919 + step).sample(
        demos, min(run.config.bc_batch_size, len(demos))
    )
    start = time.perf_counter()
    batch = run.minibatch(collate(chosen, [1.0] * len(chosen), run.pad_id))
    loss = run.learner.optimize(batch, nll(run.learner))
    figures = {"loss": loss, "grad_norm": run.learner.grad_norm, "episodes": len(chosen)}
    return {"step": step, "phase": "bc", **figures, "update_s": seconds_since(start)}


# ----- the clipped family --------------------------------------------------------------------


class ClippedRL:
    """Collect groups of episodes, turn their rewards into advantages, update the policy."""

    def __init__(self, run: TrainingContext) -> None:
        self.run = run

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
        run, config = self.run, self.run.config
        run.learner.set_learning_rate(config.rl_learning_rate or config.learning_rate)
        if config.kl_coef:
            run.learner.take_reference(run.run_dir.path / "reference.pt")
        if config.curriculum != "all" and config.bc_steps and run.collector.expert_turns is None:
            run.collector.expert_turns = run.demos.turns()
        if config.curriculum == "unsolved" and run.collector.solved is None:
            run.collector.solved = run.greedy.solved_at_start(step)
        start, horizon = time.perf_counter(), run.horizon(step)
        episodes, samples, figures = run.collector.collect(step, run.version, horizon)
        record = {"step": step, "phase": "rl", "mode": config.mode, "max_turns": horizon}
        record |= rollout_stats(episodes) | figures | {"wait_s": seconds_since(start)}
        if config.mode == "async" and step < run.total_steps:
            run.collector.launch(step + 1, run.horizon(step + 1))
        start = time.perf_counter()
        if samples:
            batch = collate(
                [token_record(s.trajectory) for s in samples], [s.advantage for s in samples], run.pad_id
            )
            # Async: the update runs in a thread while the event loop plays the next step's episodes.
            sampled_now = all(sampled_by(s.trajectory, run.version) for s in samples)
            record |= run.in_background(update_policy, run, batch, config.kl_coef, sampled_now)
        else:
            record |= {"updates": [], "skipped": "no episode to train on this step"}
        return record | {"update_s": seconds_since(start)}

    def demonstrations(self) -> list[dict[str, Any]]:
        """What behaviour cloning clones: the expert's episodes (``ExpertDemonstrations``)."""
        return self.run.demos.records()

    def evaluate(self, step: int, split: str = "test") -> dict[str, Any]:
        """Greedy episodes on held-out tasks (``GreedyPlay.evaluate``)."""
        return self.run.greedy.evaluate(step, split)


# ----- figures ---------------------------------------------------------------------------------


def sampled_by(trajectory: Trajectory, version: int) -> bool:
    """Whether the weights of ``version`` sampled every agent token of ``trajectory`` (False
    when the generator does not report versions)."""
    versions = sampled_versions(trajectory.versions, trajectory.loss_mask)
    return bool(versions) and all(v == version for v in versions)
