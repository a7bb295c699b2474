"""Engines in worker processes (issue 18 item 1, issue 19 item 2), through HTTP.

A worker that dies (``kill -9``, a segfault) or whose call passes its deadline fails only
the sessions it hosted, with 503 ``engine_failed``; the other worker's sessions keep
stepping, new sessions succeed, the worker is replaced, and shutdown leaves no process
behind. Real servers on loopback with real worker processes: textworld (jericho) for the
kill, and a ``choice`` engine that hangs or segfaults on command (``worker_envs.py``).
Timeouts here only detect hangs; nothing is timed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psutil
import pytest
from worker_envs import FaultyWorkerEnv

from agentgym import registry
from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.launcher import serve_in_thread
from conftest import engine_errors


@pytest.fixture(scope="module", autouse=True)
def faulty_env() -> Iterator[None]:
    registry.register(FaultyWorkerEnv.name, FaultyWorkerEnv, overwrite=True)
    yield
    registry.unregister(FaultyWorkerEnv.name)  # later tests list every registered env


def create(http: httpx.Client) -> dict[str, Any]:
    response = http.post("/sessions", json={"split": "test", "index": 0})
    assert response.status_code == 201, response.text
    return response.json()


def create_legacy(app: Any, http: httpx.Client) -> dict[str, Any]:
    """A session opened by AgentGym's ``/create`` (only those have an integer id) on test task 0."""
    compat_id = http.post("/create").json()["id"]
    session_id = app.state.sessions.get_compat(compat_id).session_id
    assert http.post(f"/sessions/{session_id}/reset", json={"split": "test", "index": 0}).status_code == 200
    return {"session_id": session_id, "compat_id": compat_id}


def worker_of(app: Any, session: dict[str, Any]) -> int:
    """The pid of the worker process hosting ``session``'s engine."""
    return app.state.sessions.get(session["session_id"]).env.worker.pid


def split_by_worker(app: Any, sessions: list[dict[str, Any]]) -> tuple[int, list[dict], list[dict]]:
    """(a worker's pid, its sessions, the other sessions): sessions spread over two workers."""
    pids = [worker_of(app, s) for s in sessions]
    assert len(set(pids)) == 2, "sessions were not spread over both workers"
    lost = [s for s, pid in zip(sessions, pids, strict=True) if pid == pids[0]]
    return pids[0], lost, [s for s in sessions if s not in lost]


def step(http: httpx.Client, session: dict[str, Any], action: str) -> httpx.Response:
    return http.post(f"/sessions/{session['session_id']}/step", json={"action": action})


def assert_engine_failed(response: httpx.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "engine_failed"


def assert_stopped_cleanly(app: Any, url: str, worker_pids: list[int]) -> None:
    """After ``serve_in_thread`` returned: the server thread ended and no worker is left."""
    port = url.rsplit(":", 1)[1]
    assert not [t for t in threading.enumerate() if t.name == f"agentgym-server-{port}"], "shutdown hung"
    for pid in worker_pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_killed_worker_fails_only_its_sessions_and_is_replaced() -> None:
    app = create_app(ServerConfig(env="textworld", engine_workers=2, max_sessions=8))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=300) as http:
        victim, lost, kept = split_by_worker(app, [create(http) for _ in range(4)])
        before = engine_errors(http)
        os.kill(victim, signal.SIGKILL)
        for session in lost:  # the one in a call and the idle one alike
            assert_engine_failed(step(http, session, "look"))
            assert http.get(f"/sessions/{session['session_id']}").status_code == 404
        for session in kept:
            response = step(http, session, session["info"]["expert_action"])
            assert response.status_code == 200 and response.json()["info"]["turn"] == 1
        fresh = create(http)
        assert step(http, fresh, fresh["info"]["expert_action"]).status_code == 200
        assert engine_errors(http) == before + len(lost)
        assert 'agentgym_engine_workers_replaced{env="textworld"} 1.0' in http.get("/metrics").text
        assert http.get("/health").json()["sessions"] == len(kept) + 1
        workers = app.state.sessions.host.pids()
        assert victim not in workers and len(workers) == 2  # replaced
    assert_stopped_cleanly(app, url, workers)


def test_a_segfaulting_engine_takes_only_its_worker_down() -> None:
    app = create_app(ServerConfig(env=FaultyWorkerEnv.name, engine_workers=2))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        victim, lost, kept = split_by_worker(app, [create_legacy(app, http) for _ in range(4)])
        bystander_id = lost[1]["compat_id"]
        assert_engine_failed(step(http, lost[0], "segfault"))
        # A bystander on the same worker, through AgentGym's routes: 503 once, then gone.
        assert_engine_failed(http.post("/step", json={"id": bystander_id, "action": "blue"}))
        assert http.post("/step", json={"id": bystander_id, "action": "blue"}).status_code == 404
        for session in kept:
            response = step(http, session, "blue")
            assert response.status_code == 200 and response.json()["info"]["success"]
        assert step(http, create(http), "blue").json()["info"]["success"]
        assert engine_errors(http) == 2
        workers = app.state.sessions.host.pids()
        assert victim not in workers and len(workers) == 2
    assert_stopped_cleanly(app, url, workers)


def test_a_call_past_its_deadline_kills_its_worker_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine without ``abort()`` (jericho's) cannot be freed: its worker is killed once the
    grace for an abort has passed (shortened here)."""
    monkeypatch.setattr("agentgym.servers.workers.ABORT_GRACE_S", 0.5)
    app = create_app(ServerConfig(env=FaultyWorkerEnv.name, engine_workers=2, step_deadline=1.0))
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=120) as http:
        victim, lost, kept = split_by_worker(app, [create(http) for _ in range(4)])
        stuck, bystander = lost
        response = step(http, stuck, "hang")
        assert_engine_failed(response)
        assert "1s" in response.json()["error"]["message"]
        assert http.delete(f"/sessions/{stuck['session_id']}").status_code == 404  # gone, no hang
        deadline = time.monotonic() + 30
        while victim in app.state.sessions.host.pids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert_engine_failed(step(http, bystander, "blue"))
        for session in kept:
            assert step(http, session, "blue").json()["info"]["success"]
        assert step(http, create(http), "blue").json()["info"]["success"]
        assert engine_errors(http) == 2
        assert not psutil.pid_exists(victim) or psutil.Process(victim).status() == psutil.STATUS_ZOMBIE
        workers = app.state.sessions.host.pids()
        assert len(workers) == 2 and victim not in workers
        assert app.state.sessions.stuck_calls == 0  # nothing left running: the worker was killed
    assert_stopped_cleanly(app, url, workers)
