"""``agentgym check-env``: passes on a real server, fails on a broken one, never crashes."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from typer.testing import CliRunner

from agentgym.cli import app as cli_app
from agentgym.conformance.runner import CheckResult, run_checks
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import free_port, serve_in_thread, wait_healthy

EVERY_CHECK = {
    "server reachable", "health", "metadata", "tasks: paging", "tasks: split filter", "openapi.json",
    "metrics", "create session", "session state", "episode", "step after end", "reset session",
    "errors: unknown session", "errors: malformed JSON", "errors: missing field",
    "errors: mistyped action", "errors: unknown task", "delete session", "compat: create",
    "compat: reset", "compat: observation", "compat: available_actions", "compat: step", "compat: close",
}  # fmt: skip


def by_name(results: list[CheckResult]) -> dict[str, CheckResult]:
    return {result.name: result for result in results}


def failures(results: list[CheckResult]) -> dict[str, str]:
    return {result.name: result.detail for result in results if not result.passed}


def broken_app() -> FastAPI:
    """A server that gets several parts of wire API v1 wrong, and some right.

    Wrong: /health shape, the split filter, out-of-range rewards, 200 on bad payloads and
    unknown sessions, 200 (not 204) on DELETE, no /metrics, no AgentGym routes.
    """
    app = FastAPI()
    tasks = [{"task_id": f"{split}-{i}", "split": split} for split in ("train", "test") for i in range(3)]
    sessions: dict[str, str] = {}  # session id -> task id

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"ok": True}

    @app.get("/metadata")
    def metadata() -> dict[str, Any]:
        text = dict.fromkeys(("name", "version", "description", "instruction", "action_format"), "x")
        return {**text, "splits": {"train": 3, "test": 3}, "max_turns": 5, "reward_range": [0.0, 1.0]}

    @app.get("/tasks")
    def list_tasks(offset: int = 0, limit: int = 100) -> dict[str, Any]:
        return {"tasks": tasks[offset : offset + limit], "total": len(tasks)}  # ignores ?split=

    @app.post("/sessions", status_code=201)
    async def create(request: Request) -> dict[str, Any]:
        session_id = uuid.uuid4().hex
        task_id = sessions[session_id] = (await request.json()).get("task_id", "test-0")
        info = {"task_id": task_id, "turn": 0, "score": 0.0, "success": False}
        return {"session_id": session_id, "observation": "You are in a room.", "info": info}

    @app.get("/sessions/{session_id}")
    def state(session_id: str) -> dict[str, Any]:
        return {}

    @app.post("/sessions/{session_id}/step")
    async def step(session_id: str, request: Request) -> dict[str, Any]:
        await request.body()  # accepts anything, even malformed JSON
        info = {"task_id": sessions.get(session_id, "?"), "turn": 1, "score": 1.0, "success": True}
        return {"observation": "Done.", "reward": 5.0, "terminated": True, "truncated": False, "info": info}

    @app.delete("/sessions/{session_id}")
    def delete(session_id: str) -> Response:
        sessions.pop(session_id, None)
        return Response(status_code=200)

    return app


@contextlib.contextmanager
def serve_app(app: FastAPI) -> Iterator[str]:
    """Serve any ASGI app with uvicorn in a daemon thread on loopback; yield its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout=30)
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def broken_url() -> Iterator[str]:
    with serve_app(broken_app()) as url:
        yield url


def test_every_check_passes_on_textworld_and_sessions_are_closed(textworld_url: str) -> None:
    before = httpx.get(f"{textworld_url}/health").json()["sessions"]
    results = run_checks(textworld_url)
    assert failures(results) == {}
    assert set(by_name(results)) == EVERY_CHECK
    assert "expert episode terminated" in by_name(results)["episode"].detail
    assert httpx.get(f"{textworld_url}/health").json()["sessions"] == before


def test_a_chosen_task_is_played(textworld_url: str) -> None:
    task_id = httpx.get(f"{textworld_url}/tasks", params={"split": "train", "limit": 1}).json()["tasks"][0]
    results = by_name(run_checks(textworld_url, task_id=task_id["task_id"]))
    assert results["create session"].passed
    assert task_id["task_id"] in results["create session"].detail


def test_broken_server_fails_the_right_checks(broken_url: str) -> None:
    results = by_name(run_checks(broken_url))
    failed = failures(list(results.values()))
    assert {
        "health", "tasks: split filter", "session state", "episode", "errors: unknown session",
        "errors: malformed JSON", "delete session", "metrics", "compat: create",
    } <= set(failed)  # fmt: skip
    # Isolation: what the broken server gets right still passes.
    for name in ("server reachable", "metadata", "tasks: paging", "create session"):
        assert results[name].passed, results[name].detail
    assert "outside reward_range" in failed["episode"]
    assert "expected HTTP 404, got 200" in failed["errors: unknown session"]
    assert failed["step after end"] == "skipped: needs episode"
    assert failed["compat: reset"] == "skipped: needs compat: create"


def test_unreachable_server_is_one_clear_failure() -> None:
    results = run_checks(f"http://127.0.0.1:{free_port()}")
    assert len(results) == 1
    assert results[0].name == "server reachable" and not results[0].passed
    assert "cannot reach" in results[0].detail


def test_token_is_sent_and_its_absence_refused(agentgym_cache: str) -> None:
    with serve_in_thread(ServerConfig(env="textworld", token="s3cret")) as url:
        with_token = run_checks(url, token="s3cret")
        without = by_name(run_checks(url))
    assert failures(with_token) == {}
    assert "auth" in by_name(with_token)
    assert "401" in without["metadata"].detail


def test_cli_exit_codes(textworld_url: str, broken_url: str) -> None:
    runner = CliRunner()
    good = runner.invoke(cli_app, ["check-env", textworld_url])
    assert good.exit_code == 0, good.output
    assert "0 failed" in good.output
    bad = runner.invoke(cli_app, ["check-env", broken_url])
    assert bad.exit_code == 1, bad.output
    assert "FAIL" in bad.output
