"""The `choice` env: one correct option, per-task option order, contract-checked over HTTP."""

from __future__ import annotations

import pytest

from agentgym import make
from agentgym.conformance.runner import run_checks
from agentgym.contract.errors import EpisodeOver
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread


def test_right_answer_wins_and_wrong_answer_loses_in_one_turn() -> None:
    env = make("choice")
    observation, info = env.reset(task_id="choice/test/0")
    assert "blue" in observation and sorted(info["available_actions"]) == sorted(env.options)
    _, reward, terminated, truncated, info = env.step(info["expert_action"])
    assert (reward, terminated, truncated, info["success"]) == (1.0, True, False, True)
    with pytest.raises(EpisodeOver):
        env.step("blue")
    env.reset(task_id="choice/test/0")
    _, reward, terminated, _, info = env.step("Red.")
    assert (reward, terminated, info["success"], info["lost"]) == (0.0, True, False, True)
    assert env.first_option_named("I think it is Blue, not red") == "blue"
    assert env.first_option_named("reddish bluer") is None  # whole words only


def test_option_orders_are_deterministic_and_splits_disjoint() -> None:
    first, second = make("choice"), make("choice")
    assert [t.meta for t in first.tasks("train")] == [t.meta for t in second.tasks("train")]
    train_seeds = {t.meta["seed"] for t in first.tasks("train")}
    assert train_seeds.isdisjoint(t.meta["seed"] for t in first.tasks("test"))
    assert len({tuple(t.meta["options"]) for t in first.tasks("train")}) > 5  # orders really vary


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="not among the options"):
        make("choice", answer="purple")
    with pytest.raises(ValueError, match="two distinct options"):
        make("choice", options=["a", "a"])


def test_choice_server_passes_the_wire_contract() -> None:
    with serve_in_thread(ServerConfig(env="choice")) as url:
        failed = [r for r in run_checks(url) if not r.passed]
    assert not failed, failed
