"""``babyai`` over HTTP: check-env passes, and AgentGym's own BabyAI client plays a whole
episode through the compat routes unchanged.

The client (``agentenv/envs/babyai.py``, read, not vendored) sends ``/create`` with no
body and reads ``["id"]``; every POST body is ``data | {"id": N}`` sent with ``requests``'
``json=`` (``json.dumps``' default separators); ``/reset {"data_idx": i}`` plays level
``i % 40`` of AgentGym's list from seed ``i // 40``; its ``step`` takes the model's reply,
keeps the line after ``Action:`` and strips everything but letters, digits, commas and
spaces. A local env on the same task, stepped in lockstep, gives the expert's commands
and the observations the server must answer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentgym.conformance.runner import run_checks
from agentgym.envs.babyai import BabyAIEnv
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(env="babyai")) as served:
        yield served


class BabyAIClientCalls:
    """The requests of AgentGym's ``BabyAIEnvClient``."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http
        self.env_id = self.ok(http.post("/create"))["id"]

    @staticmethod
    def ok(response: httpx.Response) -> Any:
        assert response.status_code == 200, response.text  # the client asserts exactly this
        return response.json()

    def post(self, path: str, data: dict[str, Any]) -> Any:
        data["id"] = self.env_id
        body = json.dumps(data, allow_nan=False).encode()
        return self.ok(self.http.post(f"/{path}", content=body, headers={"Content-Type": "application/json"}))

    def reset(self, data_idx: int) -> dict[str, Any]:
        return self.post("reset", {"data_idx": data_idx})

    def step(self, reply: str) -> dict[str, Any]:
        (action,) = re.findall(r"Action:\s*(.*?)(?=\n|$)", reply, re.DOTALL)
        action = " ".join(re.sub(r"[^A-Za-z0-9, ]+", "", action).split()).strip()
        response = self.post("step", {"action": action})
        return {"state": response["observation"], "reward": response["score"], "done": response["done"]}


def test_check_env_passes(url: str) -> None:
    failed = [(check.name, check.detail) for check in run_checks(url) if not check.passed]
    assert failed == []


def test_agentgym_client_plays_the_level_and_seed_it_asked_for(url: str) -> None:
    data_idx = 40 * 3 + 37  # MiniBossLevel from seed 3: a train task
    with httpx.Client(base_url=url, timeout=60) as http:
        client = BabyAIClientCalls(http)
        assert isinstance(client.env_id, int)
        reset = client.reset(data_idx)
        env = BabyAIEnv()
        observation, _ = env.reset(task_id="MiniBossLevel/3")
        assert reset["observation"] == observation and reset["task_id"] == "MiniBossLevel/3"
        assert (reset["reward"], reset["score"], reset["done"], reset["deleted"]) == (0.0, 0.0, False, False)
        assert client.ok(http.get(f"/observation?id={client.env_id}")) == observation
        while not env.done:
            action = env.expert_action()
            observation, *_ = env.step(action)
            step = client.step(f"Thought:\nI should {action}.\n\nAction:\n{action}")
            assert step["state"] == observation and step["done"] is env.done
        assert env.last_info["success"] and step["reward"] == env.last_info["score"] > 0
        assert client.post("close", {}) is True  # AgentGym's BabyAI server answers a bare true
        assert http.get(f"/observation?id={client.env_id}").status_code == 404


def test_agentgym_data_idx_reaches_levels_out_of_the_splits(url: str) -> None:
    with httpx.Client(base_url=url, timeout=60) as http:
        client = BabyAIClientCalls(http)
        reset = client.reset(40 * 1_000_000 + 25)  # KeyInBox (left out of the splits), a test seed
        assert reset["task_id"] == "KeyInBox/1000000"
        assert client.step("Action: go to red ball 9.")["state"].startswith("You see no red ball 9.")
        assert client.post("close", {}) is True
