"""Off-policy data: policy versions, staleness, and the replay buffer.

A *policy version* names the weights that sampled a token: version ``v`` is the policy
after training step ``v`` (0: before any update). Trajectories record one version per
token (``Trajectory.versions``, -1 on tokens nobody sampled). When step ``s`` updates,
the policy is at version ``s - 1``, and a token sampled at version ``v`` is
``s - 1 - v`` versions *stale*: 0 for on-policy data, 1 for one-step-off asynchronous
rollouts, more for replayed samples and episodes resumed across steps (partial rollouts).
``max_staleness`` bounds it; older data is dropped, never trained on.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from agentgym.agents.tokens import NOT_SAMPLED, oldest_version, sampled_versions
from agentgym.records.trajectory import Trajectory, read_jsonl


def staleness(trajectory: Trajectory, version: int) -> int:
    """How many versions the trajectory's oldest sampled token lags ``version``; an
    episode without recorded versions counts as on-policy (0)."""
    oldest = oldest_version(trajectory.versions)
    return 0 if oldest is None else version - oldest


def token_staleness(trajectories: Iterable[Trajectory], version: int) -> list[int]:
    """Staleness of every sampled token (with a recorded version) of ``trajectories``."""
    return [
        version - v
        for trajectory in trajectories
        for v in sampled_versions(trajectory.versions, trajectory.loss_mask)
        if v != NOT_SAMPLED
    ]


@dataclass
class Sample:
    """One trained episode as the buffer keeps it: behaviour log-probs and versions inside
    the trajectory, untouched, and the advantage its group gave it when it was fresh."""

    trajectory: Trajectory
    advantage: float | list[float]
    """One number for the whole episode, or one per agent turn."""

    def to_dict(self) -> dict:
        return {"advantage": self.advantage, "trajectory": self.trajectory.to_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Sample:
        advantage = data["advantage"]
        advantage = [float(a) for a in advantage] if isinstance(advantage, list) else float(advantage)
        return cls(Trajectory.from_dict(data["trajectory"]), advantage)


class ReplayBuffer:
    """The last ``capacity`` trained episodes, drawn again by later updates while they are
    at most ``max_staleness`` versions old (FIFO eviction; stale entries are evicted first).

    Each update mixes fresh and replayed episodes: with ``ratio`` r, ``n`` fresh episodes
    are joined by ``round(n·r/(1-r))`` replayed ones (as many as there are eligible), so
    replayed episodes make up the share r of the batch.
    """

    def __init__(self, capacity: int, max_staleness: int) -> None:
        self.capacity = capacity
        self.max_staleness = max_staleness
        self._samples: deque[Sample] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._samples)

    def add(self, samples: Iterable[Sample]) -> None:
        self._samples.extend(samples)

    def evict_stale(self, version: int) -> int:
        """Forget the samples too stale to train at ``version``; returns how many."""
        fresh = [s for s in self._samples if staleness(s.trajectory, version) <= self.max_staleness]
        evicted = len(self._samples) - len(fresh)
        self._samples = deque(fresh, maxlen=self.capacity)
        return evicted

    def draw(self, fresh: int, ratio: float, version: int, rng: random.Random) -> list[Sample]:
        """Replayed samples to join ``fresh`` fresh episodes in an update at ``version``:
        distinct, uniformly drawn among those within the staleness bound."""
        if ratio <= 0:
            return []
        self.evict_stale(version)
        wanted = round(fresh * ratio / (1 - ratio))
        return rng.sample(list(self._samples), min(wanted, len(self._samples)))

    # ----- kept with each checkpoint, so a resumed run replays the same data -----------

    def dumps(self) -> str:
        return "".join(json.dumps(s.to_dict(), ensure_ascii=False) + "\n" for s in self._samples)

    def load(self, path: Path) -> None:
        self._samples = deque((Sample.from_dict(r) for r in read_jsonl(path)), maxlen=self.capacity)


# ----- groups that finish across steps (partial rollouts) -----------------------------


def group_key(task_id: str, sample: int, group_size: int) -> tuple[str, int]:
    """The group of an episode: the trainer numbers a run's samples of a task
    consecutively, ``group_size`` per group, so ``sample // group_size`` tells groups of
    the same task (drawn at different steps) apart."""
    return task_id, sample // group_size


class PendingGroups:
    """Ended episodes wait here until every member of their group has ended: advantages
    compare the members of one group, so a group trains only when it is complete. With
    partial rollouts a group can complete steps after it started; a member that will never
    end (paused, then dropped as too stale) is :meth:`abandon`-ed so its group still does.
    """

    def __init__(self, group_size: int) -> None:
        self.group_size = group_size
        self._ended: dict[tuple[str, int], list[Trajectory]] = {}
        self._abandoned: dict[tuple[str, int], int] = {}

    def add(self, trajectories: Iterable[Trajectory]) -> None:
        for trajectory in trajectories:
            key = group_key(trajectory.task_id, trajectory.sample, self.group_size)
            self._ended.setdefault(key, []).append(trajectory)

    def abandon(self, task_id: str, sample: int) -> None:
        key = group_key(task_id, sample, self.group_size)
        self._abandoned[key] = self._abandoned.get(key, 0) + 1

    def take_complete(self) -> list[list[Trajectory]]:
        """The groups whose members have all ended or been abandoned, oldest first, then by
        task, each in sample order: not the order episodes ended in, which varies from run to
        run, so that a seed's minibatches are the same ones every time."""
        complete = sorted(
            (
                key
                for key, ended in self._ended.items()
                if len(ended) + self._abandoned.get(key, 0) >= self.group_size
            ),
            key=lambda key: (key[1], key[0]),
        )
        for key in [k for k, n in self._abandoned.items() if n >= self.group_size]:
            del self._abandoned[key]  # every member abandoned: nothing left to train
        groups = [sorted(self._ended.pop(key), key=lambda t: t.sample) for key in complete]
        for key in complete:
            self._abandoned.pop(key, None)
        return groups

    @property
    def waiting(self) -> int:
        """Ended episodes whose group has not completed yet."""
        return sum(len(ended) for ended in self._ended.values())
