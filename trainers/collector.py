"""The collector: where each update's episodes come from.

It owns the generator and the rollout state that lives across steps: the collection in
flight (``mode: async`` plays step t+1 while step t updates), paused episodes (partial
rollouts), groups waiting for their last member, and the replay buffer. :meth:`Collector.collect`
hands a step its episodes and its samples (advantages within each complete group, DAPO's
dynamic sampling with refills, fresh episodes within ``max_staleness``, replayed ones).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from agentgym.play.play_profile import PlayProfile
from agentgym.play.rollout import EpisodeSpec, RolloutConfig
from agentgym.policies.base import SamplingParams
from agentgym.records.trajectory import Trajectory, TrajectoryWriter
from agentgym.trainers.algorithms import ADVANTAGE_ESTIMATORS, dynamic_sampling_keep, shuffled_advantages
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.generators import Generator
from agentgym.trainers.learner import Learner
from agentgym.trainers.offpolicy import PendingGroups, ReplayBuffer, Sample, staleness, token_staleness

RewardHook = Callable[[Trajectory], float]
"""A custom reward: an episode's outcome score from the finished episode (its messages,
actions, per-turn rewards, the env's ``score`` and ``success``). Advantages and dynamic
sampling read it in place of the env's score."""


class Collector:
    def __init__(
        self,
        config: Any,
        learner: Learner,
        generator: Generator,
        runner: asyncio.Runner,
        dp: DataParallel,
        train_tasks: list[str],
        run_dir: Path,
        reward: RewardHook | None = None,
    ) -> None:
        self.config, self.learner, self.generator = config, learner, generator
        self.runner, self.dp = runner, dp
        self.train_tasks, self.run_dir = train_tasks, run_dir
        self.reward = reward
        """Rescores each finished episode before its advantage (None: the env's score)."""
        self.expert_turns: dict[str, int] | None = None
        """Turns the expert took per train task (``curriculum`` other than ``all``); None:
        every task is drawn."""
        self.solved: set[str] | None = None
        """``curriculum: unsolved``: train tasks the policy won greedily at the start of RL,
        left out of the draw."""
        self.published: int | None = None
        """The version the generator samples from (None: not sent yet)."""
        self.pending: asyncio.Task | None = None
        """Async mode: the collection of the next step's episodes, in flight."""
        self.groups = PendingGroups(config.group_size)
        self.replay = ReplayBuffer(config.replay_capacity, config.max_staleness)
        self.dropped_paused = 0
        """Paused episodes ended so far (on every rank) because they would train too stale."""
        self.dropped_here: list[tuple[str, int]] = []
        """(task, sample) of the paused episodes this rank dropped since the last collection."""

    def publish(self) -> None:
        """Bring the generator to the learner's weights, tagged with their version, before it
        samples again (never during a collection: its data stays one version)."""
        version = self.learner.policy.weights_version
        if self.published != version:
            self.runner.run(self.generator.update_weights(self.learner, version))
            self.published = version

    # ----- one step's episodes -----------------------------------------------------------

    def take(self, step: int, horizon: int) -> tuple[list[Trajectory], float]:
        """Step ``step``'s ended episodes (every rank's) and the collection's wall time: those
        played during the last update (async), or played now."""
        pending, self.pending = self.pending, None
        if pending is None:
            self.publish()
            local, seconds = self.runner.run(self._play(step, horizon, self._tasks(step, horizon)))
        else:
            local, seconds = self.runner.run(_result_of(pending))
        episodes = self.dp.gather(local)
        # Every rank builds the same batch from every rank's episodes, so each learns of
        # the paused episodes any rank dropped (their groups then complete without them).
        dropped, self.dropped_here = self.dp.gather(self.dropped_here), []
        for task_id, sample in dropped:
            self.groups.abandon(task_id, sample)
        self.dropped_paused += len(dropped)
        return episodes, seconds

    def launch(self, step: int, horizon: int) -> None:
        """Async mode: let the generator play step ``step``'s episodes on the event loop while
        this step updates."""
        self.publish()
        self.pending = self.runner.get_loop().create_task(
            self._play(step, horizon, self._tasks(step, horizon))
        )

    def collect(self, step: int, version: int, horizon: int) -> tuple[list[Trajectory], list[Sample], dict]:
        """Step ``step``'s episodes, written to ``rollouts/``, and the samples to train on at
        ``version`` with their figures. Dynamic sampling drops groups whose rewards are all
        equal and plays new tasks in their place, ``max_refills`` rounds at most (DAPO)."""
        episodes, seconds = self.take(step, horizon)
        episodes = self._shaped(episodes)
        self.groups.add(episodes)
        fresh = self._group_samples(self.groups.take_complete())
        wanted, used = self.config.tasks_per_step * self.config.group_size, self._tasks(step, horizon)
        for refill in range(self.config.max_refills if self.config.dynamic_sampling else 0):
            missing = -(-(wanted - len(fresh)) // self.config.group_size)
            spare = [t for t in self.pool(horizon) if t not in used]
            if missing <= 0 or not spare:
                break
            tasks = random.Random(self._seed(step) + refill + 1).sample(spare, min(missing, len(spare)))
            used += tasks
            more = self._shaped(self.dp.gather(self.runner.run(self._play(step, horizon, tasks))[0]))
            episodes += more
            self.groups.add(more)
            fresh += self._group_samples(self.groups.take_complete())
        self.record(step, episodes)
        if self.config.shuffle_advantages:  # the placebo arm
            shuffled = shuffled_advantages([s.advantage for s in fresh], random.Random(self._seed(step)))
            fresh = [dataclasses.replace(s, advantage=a) for s, a in zip(fresh, shuffled, strict=True)]
        samples, figures = self._with_replay(step, version, fresh)
        return episodes, samples, {"rollout_s": round(seconds, 2), **figures}

    def _shaped(self, episodes: list[Trajectory]) -> list[Trajectory]:
        """``episodes`` with the reward hook's value in ``shaped_score`` (the env's ``score``
        stays, so rollouts and metrics keep both); as they are without a hook."""
        if self.reward is None:
            return episodes
        return [
            e if e.errored else dataclasses.replace(e, shaped_score=float(self.reward(e))) for e in episodes
        ]

    def _tasks(self, step: int, horizon: int) -> list[str]:
        pool = self.pool(horizon)
        rng = random.Random(self._seed(step))  # the same tasks after a resume
        return rng.sample(pool, min(self.config.tasks_per_step, len(pool)))

    def pool(self, horizon: int) -> list[str]:
        """The train tasks to draw from at ``horizon``: with known expert turns, those the
        expert finishes within it (all of them if none does); with known solved tasks, the
        rest of those (all that fit if every one is solved)."""
        tasks = self.train_tasks
        if self.expert_turns is not None:
            tasks = [t for t in tasks if self.expert_turns.get(t, horizon + 1) <= horizon] or tasks
        if self.solved is not None:
            tasks = [t for t in tasks if t not in self.solved] or tasks
        return tasks

    def _seed(self, step: int) -> int:
        return self.config.seed * 1_000_003 + step

    async def _play(self, step: int, horizon: int, tasks: list[str]) -> tuple[list[Trajectory], float]:
        """Play this rank's share of the new groups of ``tasks``, resuming paused episodes
        first (partial rollouts); returns the episodes that ended and the wall time."""
        start, size = time.perf_counter(), self.config.group_size
        specs = [  # each rank plays whole groups: those of every world-th task
            # Samples are numbered through the run, so a group stays apart from the same task's later groups.
            EpisodeSpec(task, sample=(step - 1) * size + k, split="train")
            for task in self.dp.shard(tasks)
            for k in range(size)
        ]
        await self._drop_stale_paused(train_version=step - 1)
        rollout = rollout_config(self.config, horizon, sampling(self.config))
        ended = await self.generator.play(specs, rollout, self.config.partial_rollout_tokens)
        return ended, time.perf_counter() - start

    async def _drop_stale_paused(self, train_version: int) -> None:
        """Paused episodes whose first tokens would train more than ``max_staleness``
        versions late end here; their groups complete without them."""
        stale = [
            episode
            for episode in self.generator.paused
            if episode.oldest_version is not None
            and train_version - episode.oldest_version > self.config.max_staleness
        ]
        self.dropped_here += [(episode.spec.task_id, episode.spec.sample) for episode in stale]
        await self.generator.drop(stale)

    def record(self, step: int, episodes: list[Trajectory], folder: str = "rollouts") -> None:
        """Rank 0 keeps the step's episodes in ``<folder>/step-N.jsonl`` of the run, replaced
        whole, so a step redone after a crash leaves each episode once."""
        if self.dp.main:
            write_step_episodes(self.run_dir, folder, step, episodes)

    # ----- samples -------------------------------------------------------------------------

    def _group_samples(self, groups: list[list[Trajectory]]) -> list[Sample]:
        """Each complete group's usable episodes with their advantages (dynamic sampling
        drops the groups whose rewards are all equal)."""
        groups = [[t for t in group if not t.errored and t.token_ids] for group in groups]
        members = [(episode, g) for g, group in enumerate(groups) for episode in group]
        if not members:
            return []
        episodes = [  # the estimators read `score`: the hook's reward where there is one
            episode
            if episode.shaped_score is None
            else dataclasses.replace(episode, score=episode.shaped_score)
            for episode, _ in members
        ]
        group_ids = torch.tensor([g for _, g in members])
        advantages = ADVANTAGE_ESTIMATORS[self.config.advantage](episodes, group_ids)
        keep = [True] * len(members)
        if self.config.dynamic_sampling:
            keep = dynamic_sampling_keep(torch.tensor([e.score for e in episodes]), group_ids).tolist()
        return [Sample(e, a) for e, a, k in zip(episodes, advantages, keep, strict=True) if k]

    def _with_replay(self, step: int, version: int, fresh: list[Sample]) -> tuple[list[Sample], dict]:
        """``fresh`` less episodes beyond ``max_staleness``, plus replayed samples; and figures."""
        current = [s for s in fresh if staleness(s.trajectory, version) <= self.config.max_staleness]
        rng = random.Random(self.config.seed * 7_368_787 + step)
        replayed = self.replay.draw(len(current), self.config.replay_ratio, version, rng)
        samples = current + replayed
        lags = token_staleness((s.trajectory for s in samples), version)
        if lags and max(lags) > self.config.max_staleness:  # an invariant, not a setting
            raise RuntimeError(f"a batch holds tokens {max(lags)} versions stale")
        if self.config.replay_ratio > 0:
            self.replay.add(current)
        return samples, {
            "policy_version": version,
            "fresh_episodes": len(current),
            "replayed_episodes": len(replayed),
            "dropped_stale": len(fresh) - len(current),
            "waiting_episodes": self.groups.waiting,
            "paused_episodes": len(self.generator.paused),
            "dropped_paused": self.dropped_paused,
            "staleness_mean": sum(lags) / len(lags) if lags else 0.0,
            "staleness_max": max(lags, default=0),
        }


def write_step_episodes(run_dir: Path, folder: str, step: int, episodes: list[Trajectory]) -> Path:
    """``episodes`` as ``<run_dir>/<folder>/step-N.jsonl``, replaced whole (a step redone
    after a crash leaves each episode once)."""
    final = run_dir / folder / f"step-{step:06d}.jsonl"
    final.parent.mkdir(parents=True, exist_ok=True)
    staging = final.with_suffix(".tmp")
    staging.unlink(missing_ok=True)
    with TrajectoryWriter(staging, fsync=False) as writer:
        for episode in episodes:
            writer.write(episode)
    os.replace(staging, final)
    return final


def rollout_config(config: Any, max_turns: int | None, how: SamplingParams | None = None) -> RolloutConfig:
    """How the run plays episodes (training, demonstrations, evaluation): the same agent
    format and observations everywhere, so what is cloned is what is evaluated."""
    return RolloutConfig(
        max_turns=max_turns,
        sampling=how or SamplingParams(),
        concurrency=config.concurrency,
        format=config.agent_format,
        show_actions=config.show_actions,
        action_order=config.action_order,
        constrain_actions=config.constrain_actions is not False,  # None: on, as run folders saved it
        max_context_tokens=config.max_context_tokens,
    )


def sampling(config: Any, greedy: bool = False) -> SamplingParams:
    """Rollout sampling (greedy for evaluation). No per-request seed: the samples of a
    group, and the critiques of one answer, must differ (one shared seed makes them
    identical)."""
    return SamplingParams(
        temperature=0.0 if greedy else config.temperature, max_new_tokens=config.max_new_tokens
    )


async def _result_of(task: asyncio.Task) -> Any:
    return await task


def held_out_play(config: Any, dtype: str | None = None) -> PlayProfile:
    """How a run's held-out evaluation plays (greedy, at the env's fixed turn limit)."""
    return PlayProfile.of_rollout(
        rollout_config(config, config.eval_horizon, sampling(config, greedy=True)), dtype
    )
