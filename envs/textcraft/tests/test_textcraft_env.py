"""TextCraft: splits by goal over every depth, TextCraft's commands and observations, and an
expert that crafts every goal (and recovers when the agent strays)."""

from __future__ import annotations

import hashlib
import itertools
from collections import Counter

import pytest

from agentgym.envs.textcraft import TextCraftEnv

SPLITS = ("train", "validation", "test")
SIGN = "depth2/dark_oak_sign"
"""A depth-2 goal: planks from logs, a stick (from bamboo, or from planks), then the sign."""


@pytest.fixture(scope="module")
def env() -> TextCraftEnv:
    return TextCraftEnv()


def play_expert(env: TextCraftEnv, task_id: str) -> tuple[list[float], dict]:
    _, info = env.reset(task_id=task_id)
    rewards = []
    while not env.done:
        action = info["expert_action"]
        assert action in info["available_actions"]
        _, reward, _, _, info = env.step(action)
        rewards.append(reward)
    return rewards, info


def test_splits_are_disjoint_by_goal_stable_and_cover_every_depth(env: TextCraftEnv) -> None:
    assert env.splits() == {"train": 378, "test": 82, "validation": 82}
    goals = {split: {t.meta["item"] for t in env.tasks(split)} for split in SPLITS}
    for one, other in itertools.combinations(SPLITS, 2):
        assert not goals[one] & goals[other]
    for split in SPLITS:
        assert {t.meta["depth"] for t in env.tasks(split)} == {1, 2, 3, 4}
    test_ids = ",".join(t.task_id for t in env.tasks("test"))
    assert hashlib.sha256(test_ids.encode()).hexdigest()[:12] == "1ba31ef3066a"
    first = {"goal": "acacia fence gate", "item": "minecraft:acacia_fence_gate", "depth": 2, "seed": 4}
    assert env.tasks("test")[0].to_dict() == {"task_id": "depth2/acacia_fence_gate", "split": "test", **first}
    # Depths interleaved in proportion: the held-out panel (the first 32) samples every depth
    # in about its share of the split (19, 44, 17, 2 of 82), not the shallowest goals alone.
    panel = Counter(t.meta["depth"] for t in env.tasks("test")[:32])
    assert panel == {1: 7, 2: 17, 3: 7, 4: 1}


def test_the_expert_crafts_every_goal(env: TextCraftEnv) -> None:
    for split in SPLITS:
        for task in env.tasks(split):
            rewards, info = play_expert(env, task.task_id)
            assert sum(rewards) == rewards[-1] == 1.0 and info["success"], task.task_id
            assert len(rewards) <= env.max_turns


def test_the_first_observation_is_textcrafts(env: TextCraftEnv) -> None:
    task = env.task(SIGN)
    observation, info = env.reset(task_id=task.task_id)
    assert observation == env.reset(task_id=task.task_id)[0]  # the same commands, the same order
    head, goal = observation.split("\n\n")
    assert goal == "Goal: craft dark oak sign."
    shown = head.splitlines()
    assert shown[0] == "Crafting commands:" and len(shown) > 3
    assert {"craft 3 dark oak sign using 6 dark oak planks, 1 stick", "craft 4 stick using 2 planks"} <= set(
        shown
    )
    assert env.commands() == "\n".join(shown[1:]) and env.goal() == "minecraft:dark_oak_sign"
    assert info["expert_action"] == "get 2 dark oak logs"


def test_commands_answer_as_textcraft_does(env: TextCraftEnv) -> None:
    task = env.task(SIGN)
    env.reset(task_id=task.task_id)
    said = {
        "inventory": "Inventory: You are not carrying anything.",
        "get 1 dark oak sign": "Could not find dark oak sign",  # craftable: never got
        "get 1 planks": "Could not find planks",  # a tag
        "get 2 dark oak logs": "Got 2 dark oak logs",
        "craft 8 dark oak planks using 2 dark oak logs": "Could not find a valid recipe for "
        "ItemTagWithCount(item_tag=ItemTag(tag=None, item_id='minecraft:dark_oak_planks'), count=8)",
        "craft 4 dark oak planks using 1 dark oak logs": "Crafted 4 minecraft:dark_oak_planks",
        "craft 4 stick using 2 planks": "Could not find enough items to craft minecraft:stick",
        "craft 4 stick using 2 dark oak planks": "Crafted 4 minecraft:stick",
        "dance": "Could not execute dance",
    }
    for action, observation in said.items():
        assert env.step(action)[0] == observation, action
    assert env.step("inventory")[0] == "Inventory: [dark oak logs] (1) [dark oak planks] (2) [stick] (4) "
    assert env.detail() == {
        "observation": env.last_observation,
        "reward": 0.0,
        "done": False,
        "deleted": False,
    }
    # The expert plans from what is held now: 4 more planks from the log left, then the sign.
    assert env.last_info["expert_action"] == "craft 4 dark oak planks using 1 dark oak logs"
    assert env.step(env.expert_action())[1] == 0.0
    _, reward, terminated, _, info = env.step(env.expert_action())
    assert (reward, terminated, info["success"]) == (1.0, True, True)
    assert env.detail()["done"] and env.detail()["reward"] == 1.0 and "expert_action" not in info


def test_available_actions_list_the_useful_commands(env: TextCraftEnv) -> None:
    task = env.task(SIGN)
    _, info = env.reset(task_id=task.task_id)
    assert info["available_actions"] == [
        "craft 1 stick using 2 bamboo",
        "craft 3 dark oak sign using 6 dark oak planks, 1 stick",
        "craft 4 dark oak planks using 1 dark oak logs",
        "get 2 bamboo",
        "get 2 dark oak logs",
        "inventory",
    ]
    info = env.step("get 1 dark oak logs")[4]
    assert "get 1 dark oak logs" in info["available_actions"] == env.available_actions()


def test_the_turn_limit_truncates(env: TextCraftEnv) -> None:
    env.reset(options={"split": "test", "index": 0, "max_turns": 2})
    assert env.step("inventory")[2:4] == (False, False)
    assert env.step("inventory")[2:4] == (False, True)
