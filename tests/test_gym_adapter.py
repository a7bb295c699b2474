"""``agentgym.clients.gym_adapter``: a Gymnasium env over a live textworld server."""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Iterator

import gymnasium
import httpx
import pytest
from gymnasium.utils.env_checker import check_env

import agentgym
import agentgym.clients.gym_adapter
from agentgym.clients.gym_adapter import AgentGymEnv, AnyText, gym_id, register_envs

ENV_ID = "agentgym/textworld-v0"


def live_sessions(url: str) -> int:
    return httpx.get(f"{url}/health").json()["sessions"]


def first_test_task(url: str) -> str:
    return httpx.get(f"{url}/tasks", params={"split": "test", "limit": 1}).json()["tasks"][0]["task_id"]


@contextlib.contextmanager
def no_gymnasium_warnings() -> Iterator[None]:
    """Fail on any warning gymnasium issues inside the block.

    Recorded, not raised: warning filters are process-wide and the server's engine threads
    (jericho) warn too; only gymnasium's own warnings judge the adapter.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    assert [str(w.message) for w in caught if "gymnasium" in w.filename] == []


@pytest.fixture
def env(textworld_url: str) -> Iterator[gymnasium.Env]:
    made = gymnasium.make(ENV_ID, base_url=textworld_url, task_id=first_test_task(textworld_url))
    yield made
    made.close()


def test_check_env_passes_without_warnings(textworld_url: str) -> None:
    # No task fixed: resets draw tasks from the split with the seed, which check_env
    # requires to be reproducible.
    made = gymnasium.make(ENV_ID, base_url=textworld_url)
    try:
        with no_gymnasium_warnings():
            check_env(made.unwrapped)
    finally:
        made.close()


def test_every_registered_env_has_an_id_and_registration_is_idempotent() -> None:
    ids = {gym_id(name) for name in agentgym.names()}
    assert ids <= set(gymnasium.registry)
    with no_gymnasium_warnings():  # registering an id twice would warn
        importlib.reload(agentgym.clients.gym_adapter)
        assert set(register_envs()) == ids
    assert gymnasium.spec(ENV_ID).kwargs == {"env_name": "textworld"}


def test_expert_episode_ends_in_success(env: gymnasium.Env) -> None:
    observation, info = env.reset(seed=0)
    assert isinstance(observation, str) and observation
    total, terminated, truncated = 0.0, False, False
    while not (terminated or truncated):
        observation, reward, terminated, truncated, info = env.step(info["expert_action"])
        total += reward
    assert terminated and info["success"]
    assert total == pytest.approx(info["score"])


def test_seeded_reset_reproduces_the_task(textworld_url: str) -> None:
    with AgentGymEnv("textworld", base_url=textworld_url, split="test") as env:
        first = env.reset(seed=7)
        assert env.reset(seed=7) == first


def test_options_choose_the_task(textworld_url: str) -> None:
    tasks = httpx.get(f"{textworld_url}/tasks", params={"split": "test", "limit": 2}).json()["tasks"]
    with AgentGymEnv("textworld", base_url=textworld_url, max_turns=3) as env:
        _, info = env.reset(options={"split": "test", "index": 1})
        assert info["task_id"] == tasks[1]["task_id"]
        _, info = env.reset(options={"task_id": tasks[0]["task_id"]})
        assert info["task_id"] == tasks[0]["task_id"]
        assert info["max_turns"] == 3


def test_close_frees_the_server_session(textworld_url: str) -> None:
    before = live_sessions(textworld_url)
    env = gymnasium.make(ENV_ID, base_url=textworld_url, task_id=first_test_task(textworld_url))
    env.reset()
    assert live_sessions(textworld_url) == before + 1
    env.close()
    assert live_sessions(textworld_url) == before
    env.close()  # idempotent


def test_reset_replaces_a_session_the_server_dropped(env: gymnasium.Env, textworld_url: str) -> None:
    env.reset()
    dropped = env.unwrapped.session_id
    httpx.delete(f"{textworld_url}/sessions/{dropped}")  # as the server's idle TTL would
    observation, _ = env.reset()
    assert observation and env.unwrapped.session_id not in (None, dropped)


def test_step_before_reset_is_refused(textworld_url: str) -> None:
    with AgentGymEnv("textworld", base_url=textworld_url) as env, pytest.raises(gymnasium.error.ResetNeeded):
        env.step("look")


def test_text_spaces_take_any_string() -> None:
    space = AnyText(100)
    assert "open the door.\nThen: go north — café ☕" in space
    assert "" not in space and "x" * 101 not in space and 3 not in space
    space.seed(0)
    assert all(space.sample().strip() for _ in range(20))
