"""The training regimes, each a step you can read top to bottom.

* :func:`behaviour_cloning`: the warm start (and AgentEvol's first stage);
* :class:`ClippedRL`: the clipped-ratio family (BAPO, GRPO, DAPO, Dr. GRPO, RLOO,
  REINFORCE++, PPO-clip), which differ only in registry entries;
* AgentEvol (``agentevol/``) and Critique-RL (``critique_rl/``) live in their own folders,
  each with its config section; the clipped update they share is in ``update.py``.

A regime gets the trainer as a :class:`~agentgym.trainers.context.TrainingContext`
(config, learner, collector, run folder) and returns the step's metrics record.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from agentgym.agents.tokens import sampled_versions
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.chat import end_of_turn_id, reply_ids
from agentgym.rollout import EpisodeSpec, run_episodes
from agentgym.trainers.algorithms import weighted_nll
from agentgym.trainers.batch import collate
from agentgym.trainers.collector import rollout_config, sampling
from agentgym.trainers.context import TrainingContext
from agentgym.trainers.learner import Learner, PerTokenLoss
from agentgym.trainers.update import update_policy
from agentgym.trajectory import Trajectory, TrajectoryWriter, read_trajectories

log = logging.getLogger(__name__)


class TokenizedExpert:
    """The environment's expert as a token-level policy: its reply is the expert action in
    the agent format, tokenized as a model reply (ending with the end-of-turn token), so
    behaviour cloning trains on exactly the tokens the model should emit."""

    name = "expert"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_id = end_of_turn_id(tokenizer)

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        replies = []
        for request in requests:
            ids = reply_ids(self.tokenizer, request.info["expert_action"], self.end_id)
            replies.append(Generation(request.info["expert_action"], ids, [0.0] * len(ids), "stop"))
        return replies

    async def close(self) -> None:
        return None


def token_record(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as a ``collate`` record."""
    return {
        "token_ids": trajectory.token_ids,
        "loss_mask": trajectory.loss_mask,
        "logprobs": trajectory.logprobs,
        "reply_choices": trajectory.reply_choices,
    }


# ----- behaviour cloning ---------------------------------------------------------------------


def nll(learner: Learner) -> PerTokenLoss:
    """Per-token ``-w·log π``: the likelihood of the demonstrations at temperature 1."""
    return lambda micro: weighted_nll(learner.logprobs(micro, temperature=1.0)[0], micro.advantages)


def behaviour_cloning(trainer: TrainingContext, step: int) -> dict[str, Any]:
    """One optimizer step of likelihood on a minibatch of demonstrations."""
    demos = trainer.regime.demonstrations()
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
        self.expert: list[Trajectory] | None = None

    @staticmethod
    def rl_steps(config: Any) -> int:
        return config.steps

    def step(self, step: int) -> dict[str, Any]:
        """Take this step's episodes (sync: play them now; async: those played during the
        last update), start playing the next step's (async), then update."""
        trainer, config = self.trainer, self.trainer.config
        trainer.learner.set_learning_rate(config.rl_learning_rate or config.learning_rate)
        if config.kl_coef:
            trainer.learner.take_reference(trainer.run_dir.path / "reference.pt")
        if config.curriculum != "all" and config.bc_steps and trainer.collector.expert_turns is None:
            trainer.collector.expert_turns = self.expert_turns()
        if config.curriculum == "unsolved" and trainer.collector.solved is None:
            trainer.collector.solved = self.solved_at_start(step)
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
        """Token records of the expert's episodes on the first ``bc_episodes`` train tasks."""
        cloned = set(self.trainer.train_tasks[: self.trainer.config.bc_episodes])
        records = [token_record(t) for t in self.cloneable() if t.task_id in cloned]
        if not records:
            raise RuntimeError(
                f"the expert solved none of the first {len(cloned)} train tasks: nothing to clone"
            )
        return records

    def expert_turns(self) -> dict[str, int]:
        """Turns the expert took on each train task it solved; empty for an env without one."""
        try:
            return {e.task_id: e.turns for e in self.expert_episodes()}
        except (RuntimeError, ValueError) as exc:
            log.warning("curriculum fits-horizon: no expert episodes (%s); RL draws every task", exc)
            return {}

    def cloneable(self) -> list[Trajectory]:
        """The expert episodes short enough to clone (``bc_max_tokens``)."""
        limit = self.trainer.config.bc_max_tokens
        return [e for e in self.expert_episodes() if len(e.token_ids) <= limit]

    def expert_episodes(self) -> list[Trajectory]:
        """The expert's won episodes on train tasks, played once per run and kept in the run
        folder: on the first ``bc_episodes`` (to clone), and with ``curriculum:
        fits-horizon`` on every train task (RL draws from those the expert finishes within
        the horizon, however long their text)."""
        if self.expert is None:
            trainer, config = self.trainer, self.trainer.config
            path = trainer.run_dir.path / "expert.jsonl"
            if trainer.dp.main and (not path.exists() or not read_trajectories(path)):
                every = config.curriculum != "all"
                tasks = trainer.train_tasks if every else trainer.train_tasks[: config.bc_episodes]
                specs = [EpisodeSpec(t, split="train") for t in tasks]
                rollout = rollout_config(config, max_turns=None)
                episodes = trainer.complete(
                    run_episodes(trainer.url, TokenizedExpert(trainer.tokenizer), specs, rollout)
                )
                with TrajectoryWriter(path) as writer:
                    for e in episodes:
                        if e.success and e.token_ids:
                            writer.write(e)
            trainer.dp.barrier()  # the other ranks read what rank 0 wrote
            self.expert = read_trajectories(path)
            if not self.expert:
                raise RuntimeError("the expert solved no train task: nothing to clone")
        return self.expert

    def solved_at_start(self, step: int) -> set[str]:
        """``curriculum: unsolved``: the train tasks (those the expert finishes within the
        longest horizon) that the policy wins in greedy play at that horizon at the start of
        RL. Played once per run; the episodes are kept in ``rollouts/frontier/``, so a
        resumed run reads the same set instead of asking its partly trained policy."""
        trainer, config = self.trainer, self.trainer.config
        played = sorted((trainer.run_dir.path / "rollouts" / "frontier").glob("step-*.jsonl"))
        if played:
            episodes = read_trajectories(played[0])
        else:
            tasks = trainer.collector.pool(config.longest_horizon)
            specs = [EpisodeSpec(t, split="train") for t in tasks]
            episodes = self.play_greedy(step, specs, config.longest_horizon, "frontier")
        solved = {e.task_id for e in episodes if e.success}
        log.info(
            "curriculum unsolved: the policy wins %d of %d train tasks greedily", len(solved), len(episodes)
        )
        return solved

    def evaluate(self, step: int, split: str = "test") -> dict[str, Any]:
        """Greedy success at ``eval_horizon`` on the first ``eval_tasks`` test tasks (the
        before/after panel, ``eval_*`` keys) or the first ``val_tasks`` validation tasks
        (``split="validation"``, ``val_*`` keys): the rate, and each task's outcome (for the
        before/after comparison, ``heldout.py``). The episodes are kept in
        ``rollouts/eval/step-N.jsonl`` or ``rollouts/validation/step-N.jsonl`` (the viewer
        lists them beside the training episodes)."""
        trainer, config = self.trainer, self.trainer.config
        if split == "validation":
            tasks, prefix, folder = trainer.validation_tasks[: config.val_tasks], "val", "validation"
        else:
            tasks, prefix, folder = trainer.test_tasks[: config.eval_tasks], "eval", "eval"
        specs = [EpisodeSpec(t, split=split) for t in tasks]
        episodes = self.play_greedy(step, specs, config.eval_horizon, folder)
        outcomes = {e.task_id: float(e.success) for e in episodes}
        stats = rollout_stats(episodes)
        return {
            f"{prefix}_success_rate": average(outcomes.values()),
            f"{prefix}_invalid_share": stats["invalid_share"],
            f"{prefix}_context_full": stats["context_full"],
            f"{prefix}_outcomes": outcomes,
        }

    def play_greedy(
        self, step: int, specs: list[EpisodeSpec], max_turns: int, folder: str
    ) -> list[Trajectory]:
        """Play ``specs`` greedily within ``max_turns`` with the current weights; the
        episodes are kept in ``rollouts/<folder>/step-N.jsonl``."""
        trainer, config = self.trainer, self.trainer.config
        rollout = rollout_config(config, max_turns, sampling(config, greedy=True))
        if config.mode == "async":  # the generator is busy with the next step, a version behind
            episodes = trainer.complete(run_episodes(trainer.url, trainer.learner.policy, specs, rollout))
        else:
            trainer.collector.publish()
            episodes = trainer.complete(trainer.collector.generator.evaluate(specs, rollout))
        trainer.collector.record(step, episodes, folder=f"rollouts/{folder}")
        return episodes


# ----- figures ---------------------------------------------------------------------------------


def sampled_by(trajectory: Trajectory, version: int) -> bool:
    """Whether the weights of ``version`` sampled every agent token of ``trajectory`` (False
    when the generator does not report versions)."""
    versions = sampled_versions(trajectory.versions, trajectory.loss_mask)
    return bool(versions) and all(v == version for v in versions)


def rollout_stats(episodes: list[Trajectory]) -> dict[str, Any]:
    finished = [e for e in episodes if not e.errored]
    return {
        "episodes": len(episodes),
        "errored": len(episodes) - len(finished),
        "success_rate": average(float(e.success) for e in finished),
        "reward_mean": average(e.score for e in finished),
        "turns_mean": average(e.turns for e in finished),
        "invalid_share": _share(sum(e.invalid_turns for e in finished), sum(e.turns for e in finished)),
        "context_full": sum(e.end_reason == "context_full" for e in finished),
        "generated_tokens": sum(e.generated_tokens or 0 for e in finished),
        # Summed over concurrent episodes: their ratio splits the rollout's wall time.
        "generation_s_sum": round(sum(e.timings.get("generation", 0.0) for e in finished), 2),
        "env_s_sum": round(sum(e.timings.get("env", 0.0) for e in finished), 2),
    }


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def average(values: Any) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


def seconds_since(start: float) -> float:
    return round(time.perf_counter() - start, 2)
