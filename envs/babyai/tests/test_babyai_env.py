"""``babyai`` in process: splits and ids, the view and its commands, reward, the expert."""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest

from agentgym.contract.errors import UnknownTask
from agentgym.envs.babyai import BabyAIEnv
from agentgym.envs.babyai.levels import EXCLUDED, LEVELS, OFFERED, SPLIT_SEEDS


@pytest.fixture(scope="module")
def env() -> Iterator[BabyAIEnv]:
    with BabyAIEnv() as instance:
        yield instance


def play_expert(env: BabyAIEnv) -> None:
    while not env.done:
        action = env.expert_action()
        assert action in env.available_actions(), (env.current_task, action)
        env.step(action)


def test_the_expert_wins_every_test_task(env: BabyAIEnv) -> None:
    for task in env.tasks("test"):
        env.reset(task_id=task.task_id)
        play_expert(env)
        assert env.last_info["success"], task.task_id


def test_splits_are_disjoint_seed_ranges_over_the_offered_levels(env: BabyAIEnv) -> None:
    assert env.splits() == {
        "train": 20 * len(OFFERED),
        "test": 3 * len(OFFERED),
        "validation": 2 * len(OFFERED),
    }
    assert len(LEVELS) == 40 and len(OFFERED) == 40 - len(EXCLUDED)
    ids = {split: {t.task_id for t in env.tasks(split)} for split in ("train", "validation", "test")}
    assert not ids["train"] & ids["test"] and not ids["validation"] & (ids["train"] | ids["test"])
    first = env.tasks("test")[: len(OFFERED)]
    assert [t.meta["level"] for t in first] == list(OFFERED)  # round-robin: any prefix mixes levels
    assert first[0].task_id == f"{OFFERED[0]}/{SPLIT_SEEDS['test']}"
    assert env.tasks("dev") == env.tasks("validation")
    for task in env.tasks("validation"):
        assert env.task(task.task_id) == task  # ids parse back to the same task


def test_agentgym_data_idx_is_level_then_seed(env: BabyAIEnv) -> None:
    """AgentGym's server: level ``all_levels[data_idx % 40 + 1]``, seed ``data_idx // 40``."""
    assert env.compat_task_id(0) == "GoToRedBallGrey/0"
    assert env.compat_task_id(40 * 7 + 38) == "BossLevel/7"
    excluded = env.task(env.compat_task_id(25))  # KeyInBox: out of the splits, still playable
    assert excluded.meta == {"level": "KeyInBox", "seed": 0, "agentgym_data_idx": 25}
    observation, _ = env.reset(task_id=excluded.task_id)
    assert observation.startswith("Your goal: open the door\n")
    for bad in ("GoToRedBall", "NoSuchLevel/1", "GoToRedBall/-1", "GoToRedBall/x"):
        with pytest.raises(UnknownTask):
            env.task(bad)


def test_the_view_and_its_commands(env: BabyAIEnv) -> None:
    observation, info = env.reset(task_id="GoToRedBall/0")
    assert observation.splitlines()[0] == "Your goal: go to the red ball"
    assert "red ball 1 (4 steps ahead, 3 to your right)" in observation
    assert "grey ball 1" in observation and "grey ball 2" in observation  # numbered, nearest first
    assert "You are carrying nothing." in observation
    assert observation.splitlines()[-1].startswith('Available actions: ["turn left", "turn right"')
    assert "drop" not in info["available_actions"] and "pickup grey ball 2" in info["available_actions"]

    steps = env._level.step_count
    observation, reward, *_ = env.step("drop")
    assert observation.startswith("You are not carrying anything.") and reward == 0.0
    assert env._level.step_count == steps and env.turn == 1  # a turn, not a move
    assert env.step("go to purple ball 3")[0].startswith("You see no purple ball 3.")
    assert env.step("dance")[0].startswith("Unknown action: 'dance'.")
    assert env.step("check available actions")[0].startswith("You can take the following actions: turn left")

    env.step("go to grey ball 1")
    observation, *_ = env.step("Pick up.")  # the primitive; AgentGym's prompt spells it "pick up"
    assert "You are carrying a grey ball." in observation
    assert "drop" in env.available_actions()  # where the ball was
    assert "You are carrying nothing." in env.step("drop")[0]
    assert "You are carrying a grey ball." in env.step("Pick up grey ball 1.")[0]
    assert env.step("pickup")[0].startswith("There is nothing in front of you to pick up.")
    refusal = env.step("pickup red ball 1")[0]
    assert refusal.startswith("You are already carrying a grey ball: drop it first.")


def test_doors_are_opened_and_gone_through(env: BabyAIEnv) -> None:
    observation, _ = env.reset(task_id="BossLevel/3")
    assert "green closed door 1 (2 steps ahead, 2 to your left)" in observation
    assert env.step("go through green closed door 1")[0].startswith("The green closed door 1 is not open")
    env.step("toggle and go through green closed door 1")
    assert tuple(env._level.agent_pos) == (6, 15)  # past the door at (6, 14)
    env.step("turn left")
    observation, *_ = env.step("turn left")
    assert "green open door 1 (1 step ahead)" in observation and "toggle" in env.available_actions()
    env.step("go through green open door 1")
    assert tuple(env._level.agent_pos) == (6, 13)


def test_reward_is_minigrid_s_and_a_lost_level_ends_the_episode(env: BabyAIEnv) -> None:
    env.reset(task_id="GoToRedBall/0")
    _, reward, terminated, _, info = env.step("go to red ball 1")
    level = env._level
    assert terminated and info["success"]
    assert reward == info["score"] == pytest.approx(1 - 0.9 * level.step_count / level.max_steps)
    assert "The task is completed." in env.last_observation

    env.reset(task_id="GoToObjS6/0")  # the level allows 36 moves
    while not env.done:
        observation, reward, terminated, truncated, info = env.step("turn left")
    assert terminated and not truncated and info["lost"] and not info["success"] and reward == 0.0
    assert env.turn == 36 and observation.endswith("you used all 36 moves this level allows.")


def test_the_expert_takes_over_after_other_moves(env: BabyAIEnv) -> None:
    """The bot replans after every primitive the agent took, its own or not."""
    rng = random.Random(0)
    for task_id in ("PickupLoc/3", "GoToObjMazeS7/1", "BossLevel/2"):
        env.reset(task_id=task_id)
        for _ in range(4):
            moves = [a for a in env.available_actions() if not a.startswith(("pickup", "drop", "toggle"))]
            env.step(rng.choice(moves))
        play_expert(env)
        assert env.last_info["success"], task_id
