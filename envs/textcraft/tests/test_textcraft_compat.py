"""AgentGym's own TextCraft client (agentenv/envs/textcraft.py) against our server.

The requests ``TextCraftEnvClient`` sends, built as its code builds them (``requests`` with
``json=``: keys in the client's order; GETs with the id in the query string), on a real
server on loopback: ``/create`` with its body (its server starts an episode at once and
answers ``id`` and ``observation``), ``/reset {"data_idx", "id"}``, whole expert replies
through the client's own action extraction, AgentGym's extra ``/commands``, ``/goal`` and
``/detail`` routes, and ``/close``. A local env on the same task is stepped in lockstep: every
remote observation must equal the local one. Their code is not vendored; this module is
written from reading it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentgym.envs.textcraft import TextCraftEnv
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(env="textcraft")) as base:
        yield base


def requests_post(http: httpx.Client, url: str, data: dict[str, Any]) -> Any:
    """``requests.post(url, json=data)``, and the client's ``assert res.status_code == 200``."""
    body = json.dumps(data, allow_nan=False).encode()
    response = http.post(url, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    return response.json()


def client_action(reply: str) -> str:
    """What ``TextCraftEnvClient.step`` sends for a model's reply: the last ``Action:`` line,
    stripped of every character but letters, digits, commas and spaces."""
    matches = re.findall(r"Action:\s*(.*?)(?=\n|$)", reply, re.DOTALL)
    action = re.sub(r"[^A-Za-z0-9, ]+", "", matches[-1] if matches else "")
    return " ".join(action.split()).strip()


class TextCraftCalls:
    """The requests of ``TextCraftEnvClient``: every POST body is ``data | {"id": N}``."""

    def __init__(self, http: httpx.Client, base: str) -> None:
        self.http, self.base = http, base
        dir_info = {"minecraft_dir": "agentenv_textcraft/", "commands": None, "goal": None}
        created = requests_post(http, f"{base}/create", dir_info)
        self.env_id, self.observation = created["id"], created["observation"]

    def post(self, path: str, data: dict[str, Any]) -> Any:
        data["id"] = self.env_id
        return requests_post(self.http, f"{self.base}/{path}", data)

    def get(self, path: str) -> Any:
        response = self.http.get(f"{self.base}/{path}?id={self.env_id}")
        assert response.status_code == 200, response.text
        return response.json()

    def reset(self, idx: int) -> Any:
        return self.post("reset", {"data_idx": idx})

    def step(self, reply: str) -> dict[str, Any]:
        response = self.post("step", {"action": client_action(reply)})
        return {"state": response["observation"], "reward": response["reward"], "done": response["done"]}


def test_textcraft_client_plays_the_goal_it_asked_for(url: str) -> None:
    env = TextCraftEnv()
    with httpx.Client(timeout=60) as http:
        client = TextCraftCalls(http, url)
        assert isinstance(client.env_id, int)
        # /create started data_idx 0: the first task in /metadata order (train first)
        assert client.observation == env.reset(task_id=env.tasks("train")[0].task_id)[0]
        train = env.splits()["train"]
        observation, _ = env.reset(task_id="depth2/dark_oak_sign")
        index = train + [t.task_id for t in env.tasks("test")].index("depth2/dark_oak_sign")
        assert client.reset(index)["observation"] == observation == client.get("observation")
        assert client.get("goal") == "minecraft:dark_oak_sign"
        assert client.get("commands") == env.commands()
        rewards = []
        while not env.done:
            action = env.expert_action()
            local, *_ = env.step(action)
            step = client.step(f"Thought:\nI need more items.\n\nAction:\n{action}")
            assert step["state"] == local and step["done"] is env.done
            rewards.append(step["reward"])
        assert rewards[-1] == sum(rewards) == 1.0
        detail = client.get("detail")
        assert detail == {"observation": local, "reward": 1.0, "done": True, "deleted": False}
        assert client.post("close", {}) is True
        assert http.get(f"{url}/observation?id={client.env_id}").status_code == 404


def test_its_extra_routes_reach_the_replica_holding_the_session_through_the_gateway() -> None:
    """``GET /commands?id=N`` is TextCraft's own route: the gateway sends it where session N is."""
    from agentgym.servers.gateway import GatewayConfig, create_gateway_app

    with (
        serve_in_thread(ServerConfig(env="textcraft")) as one,
        serve_in_thread(ServerConfig(env="textcraft")) as two,
        serve_in_thread(create_gateway_app(GatewayConfig({"textcraft": [one, two]}))) as gateway,
        httpx.Client(base_url=f"{gateway}/envs/textcraft", timeout=30) as http,
    ):
        ids = [http.post("/create", json={}).json()["id"] for _ in range(4)]
        held = {url: httpx.get(f"{url}/health").json()["sessions"] for url in (one, two)}
        assert sorted(held.values()) == [2, 2], held  # the sessions are spread over both
        for compat_id in ids:
            commands = http.get("/commands", params={"id": compat_id})
            assert commands.status_code == 200 and "craft" in json.dumps(commands.json()), commands.text
