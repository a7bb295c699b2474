"""MCP on every env server and through the gateway, played with the official ``mcp`` SDK's
client (``streamable_http_client`` + ``ClientSession``), and MCP as a client transport of
``eval`` and ``train`` (``agentgym.clients.mcp_client``), against our servers and a foreign MCP
server of the tool contract (docs/mcp.md)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client, ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

from agentgym import registry
from agentgym.clients.mcp_client import McpEnvClient
from agentgym.clients.openenv_client import env_client
from agentgym.contract.errors import InvalidAction, Unauthorized
from agentgym.contract.sites import serve_app
from agentgym.play.evaluation import EvalConfig, evaluate
from agentgym.play.rollout import RolloutConfig
from agentgym.policies.expert import ExpertPolicy
from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.gateway import GatewayConfig, Replica, create_gateway_app
from agentgym.servers.launcher import serve_in_thread
from agentgym.servers.mcp import FIXED_TOOL_NAMES, RESERVED_TOOL_NAMES, action_types
from agentgym.trainers.loop import split_task_ids
from conftest import engine_errors

SERVERS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    # env: (env settings, server settings): small catalogues; envs not listed take defaults
    "textworld": (
        {"challenges": ["tw-cooking"], "n_train": 1, "n_test": 1, "n_validation": 1, "prefetch": False},
        {"engine_workers": 0, "warm": 0},
    ),
    "webshop": ({"n_products": 1500, "n_train": 40, "n_test": 60}, {}),
    "math": ({"n_train": 10, "n_test": 30}, {}),
    "sciworld": (  # one JVM, in an engine worker process
        {"heap_mb": 256, "max_jvms": 1, "spare_jvms": 0, "max_idle_jvms": 1},
        {"engine_workers": 1, "warm": 0},
    ),
}
STARTS = {"sciworld": {"task_id": "find-non-living-thing/0"}}
"""start_episode's arguments by env (a short task); the others play task 0 of test."""
FIRST_TEST_TASK = {"split": "test", "index": 0}
TYPED_ACTION = re.compile(r"([a-z][a-z_]*)\[(.*)\]", re.DOTALL)


@pytest.fixture(scope="module")
def serve(agentgym_cache: str) -> Iterator[Callable[[str], str]]:
    """``serve(env)``: the URL of this module's server of ``env``, started on first use."""
    with contextlib.ExitStack() as stack:
        urls: dict[str, str] = {}

        def url_of(env: str) -> str:
            if env not in urls:
                settings, server = SERVERS.get(env, ({}, {}))
                urls[env] = stack.enter_context(serve_in_thread(ServerConfig(env, settings, **server)))
            return urls[env]

        yield url_of


@contextlib.asynccontextmanager
async def mcp_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    """An initialized MCP session at ``url`` (its ``/mcp``), deleted on exit."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    async with (
        httpx2.AsyncClient(headers=headers, timeout=600) as http,  # a first textworld reset builds games
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


def tool_call(action: str, tools: dict[str, types.Tool]) -> tuple[str, dict[str, str]]:
    """The tool that plays ``action``: its verb's typed tool where the server has one, else act."""
    match = TYPED_ACTION.fullmatch(action)
    if match and match[1] in tools and match[1] != "act":
        (argument,) = tools[match[1]].input_schema["required"]
        return match[1], {argument: match[2]}
    return "act", {"action": action}


async def play_expert(session: ClientSession, start: dict[str, Any]) -> list[types.CallToolResult]:
    """One episode following ``info.expert_action``: start_episode's result, then each action's."""
    tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    results = [await session.call_tool("start_episode", start)]
    while (action := results[-1].structured_content["info"].get("expert_action")) is not None:
        results.append(await session.call_tool(*tool_call(action, tools)))
    return results


INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"},
    },
}
"""An initialize request, sent raw where a test reads the HTTP answer itself."""
ACCEPT = {"accept": "application/json, text/event-stream"}


def sessions_of(url: str) -> int:
    return httpx.get(f"{url}/health").json()["sessions"]


def wait_for_sessions(url: str, expected: int, timeout: float = 10.0) -> int:
    deadline = time.monotonic() + timeout
    while (live := sessions_of(url)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return live


def error_code(result: types.CallToolResult) -> str:
    assert result.is_error, result
    return result.structured_content["error"]["code"]


# ----- every env, whole episodes --------------------------------------------------------------


@pytest.mark.parametrize("env", registry.builtin_names())
def test_an_expert_plays_a_whole_episode_over_mcp_on_every_env(env: str, serve: Callable[[str], str]) -> None:
    url = serve(env)
    action_format = registry.make(env, **SERVERS.get(env, ({}, {}))[0]).action_format

    async def scenario() -> None:
        async with mcp_session(f"{url}/mcp") as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            typed = {kind.verb for kind in action_types(action_format)}
            assert set(tools) == FIXED_TOOL_NAMES | typed and not set(tools) & RESERVED_TOOL_NAMES
            assert (await session.call_tool("env_info", {})).structured_content["name"] == env
            results = await play_expert(session, STARTS.get(env, FIRST_TEST_TASK))
            assert not any(result.is_error for result in results), results
            first, last = results[0].structured_content, results[-1].structured_content
            assert first["info"]["turn"] == 0 and first["observation"] in results[0].content[0].text
            assert last["info"]["success"] and last["terminated"] and not last["truncated"]
            assert sum(r.structured_content["reward"] for r in results[1:]) == pytest.approx(
                last["info"]["score"]
            )
            state = (await session.call_tool("observe", {})).structured_content
            assert state["done"] and state["turn"] == len(results) - 1 and "session_id" not in state
            assert sessions_of(url) == 1
        assert wait_for_sessions(url, 0) == 0  # deleting the MCP session closed its env session

    asyncio.run(scenario())


@pytest.mark.parametrize("env", ["choice", "webshop"])  # act, typed tools
def test_agentgym_eval_plays_an_env_over_mcp(env: str, serve: Callable[[str], str], tmp_path: Path) -> None:
    """``agentgym eval --env ENV --policy expert --url http://.../mcp``, in Python."""
    config = EvalConfig(env=env, out_dir=tmp_path, n=3)
    results = asyncio.run(evaluate(f"{serve(env)}/mcp", ExpertPolicy(), config))
    assert results["success_rate"] == 1.0 and results["errored"] == 0
    assert wait_for_sessions(serve(env), 0) == 0


def test_training_lists_the_same_tasks_over_mcp_as_over_v1(serve: Callable[[str], str]) -> None:
    url = serve("math")
    assert asyncio.run(split_task_ids(f"{url}/mcp")) == asyncio.run(split_task_ids(url))


# ----- sessions: isolation, auth, bad input, capacity and TTL ------------------------------------


def test_an_mcp_sessions_episode_is_reachable_from_no_other_session_nor_route() -> None:
    app = create_app(ServerConfig(env="choice"))

    async def scenario(url: str) -> None:
        async with mcp_session(f"{url}/mcp") as owner, mcp_session(f"{url}/mcp") as other:
            first = (await owner.call_tool("start_episode", FIRST_TEST_TASK)).structured_content
            (session_id,) = app.state.sessions._sessions  # the id no tool gives out
            assert error_code(await other.call_tool("observe", {})) == "session_not_found"
            assert error_code(await other.call_tool("act", {"action": "red"})) == "session_not_found"
            assert (await other.call_tool("end_episode", {})).structured_content == {"ended": False}
            async with httpx.AsyncClient(base_url=url) as http:
                answers = [
                    await http.get(f"/sessions/{session_id}"),
                    await http.post(f"/sessions/{session_id}/step", json={"action": "red"}),
                    await http.delete(f"/sessions/{session_id}"),
                    await http.get("/openenv/state", params={"session_id": session_id}),
                    await http.post(
                        "/openenv/step", json={"session_id": session_id, "action": {"action": "red"}}
                    ),
                ]
            assert [a.json()["error"]["code"] for a in answers] == ["session_not_found"] * 5
            state = (await owner.call_tool("observe", {})).structured_content
            assert (state["turn"], state["observation"]) == (0, first["observation"])  # untouched
            expert = first["info"]["expert_action"]
            assert (await owner.call_tool("act", {"action": expert})).structured_content["info"]["success"]

    with serve_in_thread(app) as url:
        asyncio.run(scenario(url))


def test_mcp_takes_the_servers_token() -> None:
    async def scenario(url: str) -> None:
        async with mcp_session(f"{url}/mcp", token="s3cret") as session:
            assert (await session.call_tool("env_info", {})).structured_content["name"] == "choice"
        with pytest.raises(Unauthorized):
            await McpEnvClient(f"{url}/mcp").metadata()
        async with env_client(f"{url}/mcp", token="s3cret") as client:
            assert (await client.metadata()).name == "choice"

    with serve_in_thread(ServerConfig(env="choice", token="s3cret")) as url:
        refused = httpx.post(f"{url}/mcp", json=INITIALIZE, headers=ACCEPT)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        opened = httpx.post(
            f"{url}/mcp", json=INITIALIZE, headers=ACCEPT | {"authorization": "Bearer s3cret"}
        )
        assert opened.status_code == 200 and opened.headers["mcp-session-id"]
        asyncio.run(scenario(url))


def test_bad_tool_input_is_a_tool_error_and_changes_nothing(serve: Callable[[str], str]) -> None:
    url = serve("choice")
    errors_before = engine_errors(httpx.Client(base_url=url))
    refused = [
        ("act", {"action": "red"}, "session_not_found"),  # no episode yet
        ("start_episode", {"task_id": "nope"}, "task_not_found"),
        ("start_episode", {"options": {"max_turns": "x"}}, "validation_error"),
        ("start_episode", {"tasks": 1}, "validation_error"),
        ("list_tasks", {"split": "nope"}, "task_not_found"),
        ("list_tasks", {"limit": 0}, "validation_error"),
    ]
    bad_actions = [
        ({"action": ""}, "invalid_action"),
        ({"action": 5}, "validation_error"),
        ({"action": "red\u0000"}, "invalid_action"),
        ({"actio": "red"}, "validation_error"),
    ]

    async def scenario() -> None:
        async with mcp_session(f"{url}/mcp") as session:
            for tool, arguments, code in refused:
                assert error_code(await session.call_tool(tool, arguments)) == code, (tool, arguments)
            first = (await session.call_tool("start_episode", FIRST_TEST_TASK)).structured_content
            for arguments, code in bad_actions:
                assert error_code(await session.call_tool("act", arguments)) == code, arguments
            with pytest.raises(MCPError, match="unknown tool 'step'"):
                await session.call_tool("step", {"action": "red"})
            assert (await session.call_tool("observe", {})).structured_content["turn"] == 0
            await session.call_tool("act", {"action": first["info"]["expert_action"]})
            over = await session.call_tool("act", {"action": "red"})
            assert error_code(over) == "episode_over" and "call start_episode" in over.content[0].text
            again = await session.call_tool("start_episode", FIRST_TEST_TASK)  # the same env session, reset
            assert not again.is_error and sessions_of(url) == 1

    asyncio.run(scenario())
    oversized = httpx.post(f"{url}/mcp", content=b"x" * (64 * 1024 + 1), headers=ACCEPT)
    assert oversized.status_code == 413  # the server's body limit, before the MCP layer reads it
    assert wait_for_sessions(url, 0) == 0 and engine_errors(httpx.Client(base_url=url)) == errors_before


def test_capacity_and_the_idle_ttl_apply_to_mcp_episodes() -> None:
    async def scenario(url: str) -> None:
        async with (
            mcp_session(f"{url}/mcp") as first,
            mcp_session(f"{url}/mcp") as second,
            McpEnvClient(f"{url}/mcp") as client,
        ):
            assert not (await first.call_tool("start_episode", FIRST_TEST_TASK)).is_error
            full = await second.call_tool("start_episode", FIRST_TEST_TASK)
            assert error_code(full) == "at_capacity" and full.structured_content["retry_after"] >= 1
            assert (await client.metadata()).name == "choice"
            await asyncio.sleep(2.5)  # all idle past the 1 s TTL: the episode, then the MCP sessions
            assert sessions_of(url) == 0
            with pytest.raises(MCPError, match="Session not found"):  # the MCP session expired too
                await first.call_tool("observe", {})
            assert (await client.metadata()).name == "choice"  # the client opens another
            async with mcp_session(f"{url}/mcp") as third:  # the slot is free again
                assert not (await third.call_tool("start_episode", FIRST_TEST_TASK)).is_error

    with serve_in_thread(ServerConfig(env="choice", max_sessions=1, ttl=1.0)) as url:
        asyncio.run(scenario(url))


def test_a_client_that_probes_the_2026_era_falls_back_to_the_handshake(serve: Callable[[str], str]) -> None:
    """The SDK's ``Client`` (mode auto) asks ``server/discover`` first; sessions need the
    handshake, so the server refuses the probe and the client falls back."""

    async def scenario() -> None:
        async with Client(f"{serve('choice')}/mcp") as client:
            assert client.protocol_version in HANDSHAKE_PROTOCOL_VERSIONS
            started = await client.call_tool("start_episode", FIRST_TEST_TASK)
            assert not started.is_error and started.structured_content["info"]["turn"] == 0

    asyncio.run(scenario())
    assert httpx.get(f"{serve('choice')}/mcp").status_code == 405  # no server-initiated stream


def initialize(url: str, token: str | None = None) -> httpx.Response:
    headers = ACCEPT | ({"authorization": f"Bearer {token}"} if token else {})
    return httpx.post(f"{url}/mcp", json=INITIALIZE, headers=headers, timeout=30)


def test_one_client_cannot_take_every_mcp_session() -> None:
    """Twenty bare initializes from one client took all 16 MCP slots of a --max-sessions 4
    server, and everyone else got a 503 without Retry-After for the whole TTL. Now the
    per-client quota holds for MCP (4 MCP sessions a quota slot), and a refusal is a 429
    with Retry-After and a JSON-RPC error carrying v1's at_capacity, as v1 answers."""
    config = ServerConfig(env="choice", max_sessions=4, max_sessions_per_client=1, quota_by_token=True)
    with serve_in_thread(config) as url:
        assert all(initialize(url, "greedy").status_code == 200 for _ in range(4))
        refused = initialize(url, "greedy")
        assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1, refused.text
        error = refused.json()["error"]
        assert (
            error["data"]["error"]["code"] == "at_capacity" and "quota of 4 MCP sessions" in error["message"]
        )
        assert initialize(url, "polite").status_code == 200  # another client still gets in
    with serve_in_thread(ServerConfig(env="choice", max_sessions=1)) as url:  # no quotas: the capacity
        assert all(initialize(url).status_code == 200 for _ in range(4))
        full = initialize(url)
        assert full.status_code == 429 and "retry-after" in full.headers and "4 MCP sessions" in full.text


def test_mcp_sessions_without_an_episode_are_released_on_the_short_timeout() -> None:
    """Bare initializes held their MCP slots for the whole idle TTL (600 s by default). Now
    one that holds no episode is released after ``mcp_ttl`` (its slot with it, its id
    answering 404), while one that holds an episode keeps the full TTL."""

    async def scenario(url: str) -> None:
        async with mcp_session(f"{url}/mcp") as playing:
            assert not (await playing.call_tool("start_episode", FIRST_TEST_TASK)).is_error
            bare = [initialize(url) for _ in range(3)]  # with the episode's: all 4 MCP slots
            assert all(answer.status_code == 200 for answer in bare)
            assert initialize(url).status_code == 429
            await asyncio.sleep(1.5)  # past the 1 s bare timeout (and its margin), within the TTL
            assert initialize(url).status_code == 200  # a bare one's slot is free again
            ping = {"jsonrpc": "2.0", "id": 2, "method": "ping"}
            stale = {"mcp-session-id": bare[0].headers["mcp-session-id"]}
            assert httpx.post(f"{url}/mcp", json=ping, headers=ACCEPT | stale).status_code == 404
            observed = await playing.call_tool("observe", {})  # the episode's session lives on
            assert not observed.is_error and observed.structured_content["turn"] == 0

    with serve_in_thread(ServerConfig(env="choice", max_sessions=1, ttl=60.0, mcp_ttl=1.0)) as url:
        asyncio.run(scenario(url))


@pytest.mark.parametrize("bad_id", [{"a": 1}, [1], True, 1.5, float("nan")])
def test_a_request_id_that_is_not_a_string_or_integer_is_an_invalid_request(
    bad_id: Any, serve: Callable[[str], str]
) -> None:
    raw = json.dumps(INITIALIZE | {"id": bad_id}).encode()  # NaN as the literal some clients send
    answer = httpx.post(
        f"{serve('choice')}/mcp", content=raw, headers=ACCEPT | {"content-type": "application/json"}
    )
    assert answer.status_code == 400 and answer.json()["error"]["code"] == -32600, answer.text


# ----- through the gateway -------------------------------------------------------------------------


def test_the_gateway_keeps_each_mcp_session_on_its_replica(tmp_path: Path) -> None:
    opened, counted = asyncio.Barrier(5), asyncio.Event()

    async def episode(url: str) -> bool:
        async with mcp_session(url) as session:
            started = (await session.call_tool("start_episode", FIRST_TEST_TASK)).structured_content
            await opened.wait()  # every episode is open at once
            await counted.wait()
            result = await session.call_tool("act", {"action": started["info"]["expert_action"]})
            return result.structured_content["info"]["success"]

    async def spread(gateway: str, replicas: list[str]) -> None:
        plays = [asyncio.create_task(episode(f"{gateway}/envs/choice/mcp")) for _ in range(4)]
        await opened.wait()
        assert [await asyncio.to_thread(sessions_of, r) for r in replicas] == [2, 2]
        counted.set()
        assert all(await asyncio.gather(*plays))

    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(serve_in_thread(ServerConfig(env="choice"))) for _ in range(2)]
        config = GatewayConfig(replicas={"choice": replicas}, health_interval=30.0)
        gateway = stack.enter_context(serve_app(create_gateway_app(config)))
        asyncio.run(spread(gateway, replicas))
        assert [wait_for_sessions(r, 0) for r in replicas] == [0, 0]
        keys = {Replica("choice", r, i).key for i, r in enumerate(replicas)}
        opened = httpx.post(f"{gateway}/envs/choice/mcp", json=INITIALIZE, headers=ACCEPT)
        assert opened.headers["mcp-session-id"].partition("-")[0] in keys
        results = asyncio.run(
            evaluate(f"{gateway}/envs/choice/mcp", ExpertPolicy(), EvalConfig("choice", tmp_path, n=4))
        )
        assert results["success_rate"] == 1.0


# ----- a foreign MCP server of the contract ---------------------------------------------------


def guessing_server() -> MCPServer:
    """Another MCP server of the tool contract (docs/mcp.md), made with the SDK: its own env
    (guess a digit), and typed action tools only (``guess``, no ``act``)."""
    server = MCPServer("guess", log_level="WARNING")
    secrets: dict[str, int] = {}

    @server.tool()
    def env_info() -> dict[str, Any]:
        splits = {"test": 3}
        about = {"name": "guess", "version": "1", "description": "", "instruction": "Guess: guess[N]."}
        return about | {
            "action_format": "guess[digit]",
            "splits": splits,
            "max_turns": 5,
            "reward_range": [0, 1],
        }

    @server.tool()
    def list_tasks(split: str | None = None, offset: int = 0, limit: int = 100) -> dict[str, Any]:
        tasks = [{"task_id": f"guess/{i}", "split": "test"} for i in range(3)]
        return {"tasks": tasks[offset : offset + limit], "total": len(tasks)}

    @server.tool()
    def start_episode(
        ctx: Context, task_id: str, seed: int | None = None, options: dict | None = None
    ) -> dict:
        secrets[ctx.headers["mcp-session-id"]] = secret = int(task_id.removeprefix("guess/")) + 3
        return {"observation": "A digit?", "info": {"expert_action": f"guess[{secret}]", "turn": 0}}

    @server.tool()
    def guess(ctx: Context, digit: str) -> dict[str, Any]:
        won = digit == str(secrets[ctx.headers["mcp-session-id"]])
        info = {"score": float(won), "success": won}
        return {
            "observation": "Yes!" if won else "No.",
            "reward": float(won),
            "terminated": won,
            "truncated": False,
            "info": info,
        }

    return server


def test_agentgym_eval_plays_a_foreign_mcp_server_of_the_contract(tmp_path: Path) -> None:
    async def refused_action(url: str) -> None:
        async with McpEnvClient(url) as client:
            created = await client.create("guess/0")
            with pytest.raises(InvalidAction, match="none of the server's actions"):
                await client.step(created.session_id, "hello")  # no act tool: a spent turn

    with serve_app(guessing_server().streamable_http_app()) as url:
        config = EvalConfig("guess", tmp_path, rollout=RolloutConfig(concurrency=1))
        results = asyncio.run(evaluate(f"{url}/mcp", ExpertPolicy(), config))
        assert results["success_rate"] == 1.0 and results["episodes"] == 3
        asyncio.run(refused_action(f"{url}/mcp"))
