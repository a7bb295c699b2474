"""The off-policy bookkeeping: staleness, the replay buffer and groups that complete
across steps (trainers/offpolicy.py). The trainer runs that use them are in
tests/test_async_training.py."""

from __future__ import annotations

import random

import pytest

from agentgym.agents.tokens import oldest_version
from agentgym.records.trajectory import Trajectory
from agentgym.trainers.offpolicy import (
    PendingGroups,
    ReplayBuffer,
    Sample,
    staleness,
    token_staleness,
)


def episode(task: str, sample: int, versions: list[int], score: float = 0.0) -> Trajectory:
    """Two prompt tokens, then one sampled token per entry of ``versions``."""
    n = len(versions)
    return Trajectory(
        env="choice",
        task_id=task,
        policy="tiny",
        messages=[],
        sample=sample,
        token_ids=list(range(2 + n)),
        loss_mask=[0, 0] + [1] * n,
        logprobs=[0.0, 0.0] + [-0.1 * (i + 1) - sample for i in range(n)],
        versions=[-1, -1, *versions],
        score=score,
    )


def test_staleness_counts_from_the_oldest_sampled_token() -> None:
    resumed = episode("t", 0, [3, 3, 5])  # paused at version 3, resumed at 5
    assert oldest_version(resumed.versions) == 3
    assert staleness(resumed, 6) == 3
    assert sorted(token_staleness([resumed], 6)) == [1, 3, 3]
    unknown = episode("t", 1, [])
    assert oldest_version(unknown.versions) is None and staleness(unknown, 9) == 0


def test_replay_mixes_by_ratio_and_never_returns_stale_samples() -> None:
    buffer = ReplayBuffer(capacity=100, max_staleness=2)
    buffer.add(Sample(episode("t", i, [i // 4]), advantage=float(i)) for i in range(40))  # versions 0..9
    rng = random.Random(0)
    drawn = buffer.draw(fresh=6, ratio=0.25, version=9, rng=rng)
    assert len(drawn) == 2  # 6 fresh + 2 replayed: a quarter of the batch
    assert all(staleness(s.trajectory, 9) <= 2 for s in drawn)
    assert len(buffer) == 12  # versions 7, 8, 9 kept; the rest evicted as stale
    many = buffer.draw(fresh=100, ratio=0.5, version=9, rng=rng)
    assert len(many) == 12 and len({id(s) for s in many}) == 12  # all eligible, each once
    assert buffer.draw(fresh=6, ratio=0.0, version=9, rng=rng) == []


def test_replayed_samples_keep_their_log_probs_versions_and_advantage(tmp_path) -> None:
    originals = [episode("t", i, [2, 2, 3], score=i / 4) for i in range(4)]
    expected = [(t.logprobs[:], t.versions[:]) for t in originals]
    buffer = ReplayBuffer(capacity=8, max_staleness=5)
    buffer.add(Sample(t, advantage=i - 1.5) for i, t in enumerate(originals))
    path = tmp_path / "replay.jsonl"
    path.write_text(buffer.dumps())  # what a checkpoint keeps
    restored = ReplayBuffer(capacity=8, max_staleness=5)
    restored.load(path)
    for sample in restored.draw(fresh=4, ratio=0.5, version=6, rng=random.Random(1)):
        i = sample.trajectory.sample
        assert (sample.trajectory.logprobs, sample.trajectory.versions) == expected[i]
        assert sample.advantage == i - 1.5


def test_capacity_drops_the_oldest_first() -> None:
    buffer = ReplayBuffer(capacity=3, max_staleness=10)
    buffer.add(Sample(episode("t", i, [0]), 0.0) for i in range(5))
    kept = buffer.draw(fresh=30, ratio=0.5, version=0, rng=random.Random(0))
    assert sorted(s.trajectory.sample for s in kept) == [2, 3, 4]


def test_a_group_trains_only_once_every_member_ended_or_was_abandoned() -> None:
    groups = PendingGroups(group_size=3)
    groups.add([episode("a", 0, [0]), episode("a", 1, [0]), episode("b", 3, [0])])
    assert groups.take_complete() == [] and groups.waiting == 3
    groups.add([episode("a", 2, [1])])  # the paused member of a's group ended a step later
    (complete,) = groups.take_complete()
    assert sorted(t.sample for t in complete) == [0, 1, 2]
    groups.add([episode("b", 4, [0]), episode("b", 6, [1])])  # sample 6: b's next group, apart
    groups.abandon("b", 5)  # dropped as too stale
    (complete,) = groups.take_complete()
    assert sorted(t.sample for t in complete) == [3, 4]
    assert groups.waiting == 1


def test_complete_groups_come_in_one_order_whatever_order_their_members_ended_in() -> None:
    """Oldest group first, then by task, members by sample: the learner's minibatches are
    drawn from this list, so a seed must get the same list however the episodes raced."""
    members = [episode(task, sample, [0]) for task in ("b", "a") for sample in (5, 4, 3, 2, 1, 0)]
    orders = []
    for shuffle_seed in range(3):
        random.Random(shuffle_seed).shuffle(members)
        groups = PendingGroups(group_size=3)
        groups.add(members)
        orders.append([[(t.task_id, t.sample) for t in group] for group in groups.take_complete()])
    assert orders[0] == [
        [("a", 0), ("a", 1), ("a", 2)],
        [("b", 0), ("b", 1), ("b", 2)],
        [("a", 3), ("a", 4), ("a", 5)],
        [("b", 3), ("b", 4), ("b", 5)],
    ]
    assert orders[1] == orders[0] and orders[2] == orders[0]


@pytest.mark.parametrize("ratio", [-0.1, 1.0])
def test_config_rejects_bad_off_policy_settings(ratio: float) -> None:
    from agentgym.trainers.config import TrainConfig

    with pytest.raises(ValueError, match="replay_ratio"):
        TrainConfig(replay_ratio=ratio)
    with pytest.raises(ValueError, match="max_staleness must be at least 1"):
        TrainConfig(mode="async", max_staleness=0)
    with pytest.raises(ValueError, match="mode must be"):
        TrainConfig(mode="later")
    with pytest.raises(ValueError, match="agentevol trains in mode: sync"):
        TrainConfig(algo="agentevol", mode="async")
    with pytest.raises(ValueError, match="partial_rollout_tokens must be a number"):
        TrainConfig(partial_rollout_tokens="many")
    with pytest.raises(ValueError, match="partial_rollout_tokens needs generator hf or vllm"):
        TrainConfig(partial_rollout_tokens=64, generator="ray")
    assert TrainConfig(partial_rollout_tokens="64").partial_rollout_tokens == 64  # from --set / YAML
