"""OpenEnv's protocol on our env servers and the gateway (issue 20, item 2), played with
OpenEnv's own client (``GenericEnvClient`` from openenv-core) on real loopback servers.

Where OpenEnv's client cannot show a detail (it sends no headers, and reports a refused
session only as a closed connection), a raw ``websockets`` connection reads the frames.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect as websocket_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from agentgym.servers.app import ServerConfig
from agentgym.servers.gateway import GatewayConfig, create_gateway_app
from agentgym.servers.launcher import serve_in_thread

openenv_client = pytest.importorskip("openenv.core.generic_client")
GenericEnvClient = openenv_client.GenericEnvClient

EPISODES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # env: (server settings, reset arguments): small catalogues, one short task each
    "textworld": ({}, {"split": "test", "index": 0}),
    "webshop": ({"n_products": 1500, "n_train": 40, "n_test": 60}, {"split": "test", "index": 0}),
    "search": ({}, {"split": "test", "index": 0}),
    "math": ({"n_train": 10, "n_test": 30}, {"split": "test", "index": 0}),
    "sciworld": (
        {"heap_mb": 256, "max_jvms": 2, "spare_jvms": 0, "max_idle_jvms": 1},
        {"task_id": "find-non-living-thing/0"},
    ),
}


def ws_base(url: str, token: str | None = None) -> str:
    """``http://host:port/...`` as OpenEnv's ``base_url``, the token as Basic credentials
    (the only way its client can send one: ``websockets`` turns them into a header)."""
    return "ws://" + (f"agent:{token}@" if token else "") + url.removeprefix("http://")


def sessions_of(url: str) -> int:
    return httpx.get(f"{url}/health").json()["sessions"]


def wait_for_sessions(url: str, expected: int, timeout: float = 15.0) -> int:
    """The server's live sessions once they reach ``expected`` (or after ``timeout`` s):
    closing a connection frees its session asynchronously."""
    deadline = time.monotonic() + timeout
    while (live := sessions_of(url)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return live


def play_expert(base_url: str, reset: dict[str, Any]) -> list[Any]:
    """One episode with OpenEnv's client, following ``info.expert_action``: its results."""
    # A first textworld reset may wait minutes for its games to be generated.
    with GenericEnvClient(base_url=base_url, message_timeout_s=600).sync() as env:
        results = [env.reset(**reset)]
        while not results[-1].done:
            action = results[-1].observation["info"]["expert_action"]
            results.append(env.step({"action": action}))
        state = env.state()
    assert state["step_count"] == len(results) - 1 == state["turn"] and state["done"]
    return results


async def raw_exchange(url: str, messages: list[object], **connect: Any) -> list[dict[str, Any]]:
    """Send each message (a dict as JSON, a str as is) on one raw connection to ``url``
    and collect the replies."""
    replies = []
    async with websocket_connect(url, **connect) as ws:
        for message in messages:
            await ws.send(message if isinstance(message, str) else json.dumps(message))
            replies.append(json.loads(await ws.recv()))
    return replies


@pytest.fixture(scope="module")
def choice_server() -> Iterator[str]:
    with serve_in_thread(ServerConfig(env="choice")) as url:
        yield url


# ----- whole episodes on every env ---------------------------------------------------------


@pytest.mark.parametrize("env", list(EPISODES))
def test_openenv_client_plays_an_expert_episode_on_every_env(env: str) -> None:
    if env == "sciworld":
        pytest.importorskip("scienceworld")
    settings, reset = EPISODES[env]
    with serve_in_thread(ServerConfig(env=env, env_config=settings)) as url:
        results = play_expert(ws_base(url), reset)
        first, last = results[0].observation, results[-1].observation
        assert first["text"] and first["info"]["turn"] == 0 and results[0].reward is None
        if "task_id" in reset:
            assert first["info"]["task_id"] == reset["task_id"]
        assert last["info"]["success"] and last["terminated"] and not last["truncated"]
        assert sum(r.reward for r in results[1:]) == pytest.approx(last["info"]["score"])
        assert wait_for_sessions(url, 0) == 0  # the client's close freed the engine


# ----- sessions: one per connection, our capacity and TTL ------------------------------------


def test_each_connection_is_one_session_freed_on_close_and_on_disconnect(choice_server: str) -> None:
    async def scenario() -> None:
        polite = GenericEnvClient(base_url=ws_base(choice_server))
        await polite.connect()
        rude = await websocket_connect(f"{ws_base(choice_server)}/ws")
        abrupt = await websocket_connect(f"{ws_base(choice_server)}/ws")
        await rude.send(json.dumps({"type": "reset", "data": {"split": "test", "index": 1}}))
        assert json.loads(await rude.recv())["type"] == "observation"
        assert sessions_of(choice_server) == 3
        await polite.close()  # OpenEnv's "close" message
        assert await asyncio.to_thread(wait_for_sessions, choice_server, 2) == 2
        await rude.close()  # a close frame, no "close" message
        assert await asyncio.to_thread(wait_for_sessions, choice_server, 1) == 1
        abrupt.transport.abort()  # the TCP connection dropped, no close frame at all
        assert await asyncio.to_thread(wait_for_sessions, choice_server, 0) == 0

    asyncio.run(scenario())


def test_capacity_is_shared_with_v1_and_a_full_server_refuses_with_capacity_reached() -> None:
    with serve_in_thread(ServerConfig(env="choice", max_sessions=1)) as url:
        with GenericEnvClient(base_url=ws_base(url)).sync() as holder:
            holder.reset()
            assert httpx.post(f"{url}/sessions", json={}).status_code == 429
            refused = asyncio.run(_first_frame(f"{ws_base(url)}/ws"))
            assert refused["type"] == "error" and refused["data"]["code"] == "CAPACITY_REACHED"
            assert refused["data"]["error"]["code"] == "at_capacity"
            # The error reply, or (when the server's close came first) the close frame, names it.
            refusal = pytest.raises((RuntimeError, ConnectionClosed), match="CAPACITY_REACHED")
            with refusal, GenericEnvClient(base_url=ws_base(url)).sync() as late:
                late.reset()
            assert sessions_of(url) == 1
        assert wait_for_sessions(url, 0) == 0
        with GenericEnvClient(base_url=ws_base(url)).sync() as next_one:  # the slot is free again
            assert next_one.reset().observation["info"]["turn"] == 0


async def _first_frame(url: str) -> dict[str, Any]:
    """The first frame a server sends unasked (a refused session's error reply)."""
    async with websocket_connect(url) as ws:
        return json.loads(await ws.recv())


def test_an_idle_connection_loses_its_session_after_the_ttl() -> None:
    with (
        serve_in_thread(ServerConfig(env="choice", ttl=1.0)) as url,
        GenericEnvClient(base_url=ws_base(url)).sync() as env,
    ):
        reset = env.reset(split="test", index=0)
        assert sessions_of(url) == 1
        assert wait_for_sessions(url, 0) == 0  # expired while the connection stayed open
        with pytest.raises(RuntimeError, match="SESSION_ERROR"):
            env.step({"action": reset.observation["info"]["expert_action"]})


def test_bad_messages_get_error_replies_and_the_session_goes_on(choice_server: str) -> None:
    replies = asyncio.run(
        raw_exchange(
            f"{ws_base(choice_server)}/ws",
            [
                "{not json",
                {"type": "jump"},
                {"type": "step", "data": {"action": "red"}},  # before any reset
                {"type": "reset", "data": {"split": "test", "index": 0, "sed": 1}},
                {"type": "reset", "data": {"task_id": "no/such/task"}},
                {"type": "reset", "data": {"split": "test", "index": 0}},
                {"type": "step", "data": {"command": "red"}},
                {"type": "step", "data": {"action": "   "}},
                {"type": "step", "data": {"action": "x" * 70_000}},
                {"type": "state"},
            ],
        )
    )
    codes = [(r["data"]["code"], r["data"]["error"]["code"]) for r in replies[:5] if r["type"] == "error"]
    assert codes == [
        ("INVALID_JSON", "invalid_payload"),
        ("UNKNOWN_TYPE", "validation_error"),
        ("EXECUTION_ERROR", "episode_over"),
        ("VALIDATION_ERROR", "validation_error"),
        ("EXECUTION_ERROR", "task_not_found"),
    ]
    assert replies[5]["type"] == "observation" and replies[5]["data"]["observation"]["info"]["turn"] == 0
    assert [r["data"]["code"] for r in replies[6:9]] == ["VALIDATION_ERROR"] * 3
    assert replies[9] == {"type": "state", "data": replies[9]["data"]} and replies[9]["data"]["turn"] == 0


# ----- the token ------------------------------------------------------------------------------


def test_with_a_token_ws_takes_it_as_header_basic_or_query_and_refuses_the_rest() -> None:
    with serve_in_thread(ServerConfig(env="choice", token="s3cret")) as url:
        ws = f"{ws_base(url)}/ws"
        reset = [{"type": "reset", "data": {}}]
        for connect in (
            {"uri": ws, "additional_headers": {"Authorization": "Bearer s3cret"}},
            {"uri": f"{ws}?token=s3cret"},
            {"uri": f"{ws_base(url, 's3cret')}/ws"},
        ):
            assert asyncio.run(raw_exchange(connect.pop("uri"), reset, **connect))[0]["type"] == "observation"
        for refused in (ws, f"{ws}?token=wrong", f"{ws_base(url, 'wrong')}/ws"):
            with pytest.raises(InvalidStatus, match="403"):
                asyncio.run(raw_exchange(refused, reset))
        with pytest.raises(ConnectionError, match="403"):
            GenericEnvClient(base_url=ws_base(url)).sync().connect()
        assert play_expert(ws_base(url, "s3cret"), {"split": "test", "index": 2})[-1].observation["info"][
            "success"
        ]
        assert httpx.get(f"{url}/openenv/health").json() == {"status": "healthy"}  # open, like /health
        assert httpx.get(f"{url}/openenv/schema").status_code == 401
        assert sessions_of(url) == 0


# ----- OpenEnv's HTTP shapes under /openenv -------------------------------------------------


def test_openenv_http_routes_beside_v1_and_compat(choice_server: str) -> None:
    with httpx.Client(base_url=choice_server) as http:
        assert http.get("/openenv/health").json() == {"status": "healthy"}
        assert http.get("/health").json()["env"] == "choice"  # v1's stays
        metadata = http.get("/openenv/metadata").json()
        assert metadata["name"] == "choice" and metadata["readme_content"]
        schema = http.get("/openenv/schema").json()
        assert set(schema) == {"action", "observation", "state"}
        assert schema["action"]["required"] == ["action"]
        reset = http.post("/openenv/reset", json={"split": "test", "index": 3}).json()
        assert set(reset) == {"observation", "reward", "done"} and reset["done"] is False
        session_id = reset["observation"]["session_id"]
        action = {"action": reset["observation"]["info"]["expert_action"]}
        step = http.post("/openenv/step", json={"session_id": session_id, "action": action}).json()
        assert step["done"] and step["reward"] == 1.0 and step["observation"]["info"]["success"]
        state = http.get("/openenv/state", params={"session_id": session_id}).json()
        assert (state["episode_id"], state["step_count"], state["done"]) == (session_id, 1, True)
        assert http.post("/openenv/step", json={"session_id": "nope", "action": action}).status_code == 404
        assert http.post("/openenv/step", json={"action": action}).status_code == 422
        assert (
            http.post("/openenv/step", json={"session_id": session_id, "action": {"x": 1}}).status_code == 422
        )
        compat = http.post("/create").json()  # the root /reset and /step stay AgentGym's
        assert http.post("/reset", json={"id": compat["id"], "data_idx": 0}).status_code == 200
        assert http.delete(f"/sessions/{session_id}").status_code == 204


# ----- through the gateway --------------------------------------------------------------------


@contextlib.contextmanager
def fleet(count: int, **server: Any) -> Iterator[tuple[str, list[str]]]:
    """``count`` choice replicas behind a gateway: (gateway URL, replica URLs)."""
    with contextlib.ExitStack() as stack:
        replicas = [
            stack.enter_context(serve_in_thread(ServerConfig(env="choice", **server))) for _ in range(count)
        ]
        config = GatewayConfig(replicas={"choice": replicas}, health_interval=0.2)
        yield stack.enter_context(serve_in_thread(create_gateway_app(config))), replicas


def test_openenv_client_through_the_gateway_spreads_sessions_and_frees_them() -> None:
    with fleet(2) as (gateway, replicas):
        base = ws_base(f"{gateway}/envs/choice")
        clients = [GenericEnvClient(base_url=base).sync() for _ in range(4)]
        for index, client in enumerate(clients):
            client.connect()
            client.reset(split="test", index=index)
            time.sleep(0.3)  # a health poll between the connections
        assert [sessions_of(r) for r in replicas] == [2, 2]
        for client in clients:
            info = client.state()["info"]
            assert client.step({"action": info["expert_action"]}).observation["info"]["success"]
            client.close()
        assert [wait_for_sessions(r, 0) for r in replicas] == [0, 0]
        assert play_expert(base, {"split": "test", "index": 5})[-1].observation["info"]["success"]


def test_gateway_refuses_when_every_replica_is_full_and_relays_the_token() -> None:
    with fleet(2, max_sessions=1, token="s3cret") as (gateway, replicas):
        base = ws_base(f"{gateway}/envs/choice", "s3cret")
        with pytest.raises(ConnectionError, match="403"):  # the replicas refuse a missing token
            GenericEnvClient(base_url=ws_base(f"{gateway}/envs/choice")).sync().connect()
        holders = [GenericEnvClient(base_url=base).sync() for _ in range(2)]
        for holder in holders:
            holder.connect()
            time.sleep(0.3)
        refusal = pytest.raises((RuntimeError, ConnectionClosed), match="CAPACITY_REACHED")
        with refusal, GenericEnvClient(base_url=base).sync() as late:
            late.reset()
        for holder in holders:
            holder.close()
        assert [wait_for_sessions(r, 0) for r in replicas] == [0, 0]
        unknown = asyncio.run(_first_frame(f"{ws_base(gateway, 's3cret')}/envs/nope/ws"))
        assert unknown["data"]["error"]["code"] == "env_not_found"


def test_openenv_http_sessions_keep_affinity_through_the_gateway() -> None:
    with fleet(2) as (gateway, replicas), httpx.Client(base_url=f"{gateway}/envs/choice") as http:
        resets = [http.post("/openenv/reset", json={"split": "test", "index": i}).json() for i in range(4)]
        assert sorted(sessions_of(r) for r in replicas) == [2, 2]
        for reset in resets:
            session_id = reset["observation"]["session_id"]
            action = {"action": reset["observation"]["info"]["expert_action"]}
            step = http.post("/openenv/step", json={"session_id": session_id, "action": action}).json()
            assert step["observation"]["info"]["success"] and step["observation"]["session_id"] == session_id
            state = http.get("/openenv/state", params={"session_id": session_id}).json()
            assert state["episode_id"] == session_id and state["step_count"] == 1
        assert http.get("/openenv/schema").json()["action"]["required"] == ["action"]
