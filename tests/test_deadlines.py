"""Issue 19 item 2 (the part that needs no worker processes): every engine call has a
deadline. A call past it fails its session with 503 ``engine_failed`` at once, frees the
session's lock (DELETE and the reaper never hang on it), moves the engine-error metric,
leaves the other sessions alone, and lets the server shut down in bounded time.

The input rules catch every hang found so far, so the hang here comes from a test env: a
real ``choice`` engine whose step blocks on the action ``hang`` until the test lets go.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, ClassVar

import httpx
import pytest

from agentgym import registry
from agentgym.contract.core import Transition
from agentgym.envs.choice import ChoiceEnv
from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.launcher import serve_in_thread
from conftest import engine_errors

RELEASE = threading.Event()


class HangingChoiceEnv(ChoiceEnv):
    """``choice`` whose engine hangs on ``hang`` (as jericho did on ``\\hello``)."""

    name: ClassVar[str] = "hanging-choice"

    def _step(self, action: str) -> Transition:
        if action == "hang":
            RELEASE.wait(timeout=120)
        return super()._step(action)


@pytest.fixture(scope="module", autouse=True)
def hanging_env() -> Iterator[None]:
    registry.register(HangingChoiceEnv.name, HangingChoiceEnv, overwrite=True)
    yield
    RELEASE.set()
    registry.unregister(HangingChoiceEnv.name)  # later tests list every registered env


def create(http: httpx.Client) -> dict[str, Any]:
    return http.post("/sessions", json={"split": "test", "index": 0}).json()


def test_a_step_past_its_deadline_fails_only_its_session_and_shutdown_is_bounded() -> None:
    app = create_app(ServerConfig(env=HangingChoiceEnv.name, step_deadline=1.0))
    started = time.monotonic()
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=30) as http:
        stuck, bystander = create(http), create(http)
        began = time.monotonic()
        response = http.post(f"/sessions/{stuck['session_id']}/step", json={"action": "hang"})
        assert response.status_code == 503 and response.json()["error"]["code"] == "engine_failed"
        assert "1s" in response.json()["error"]["message"]
        assert time.monotonic() - began < 10
        assert engine_errors(http) == 1
        assert http.delete(f"/sessions/{stuck['session_id']}").status_code == 404  # gone, no hang
        step = http.post(f"/sessions/{bystander['session_id']}/step", json={"action": "blue"})
        assert step.status_code == 200 and step.json()["info"]["success"]
        assert http.post("/sessions", json={}).status_code == 201  # still taking new sessions
        stopping = time.monotonic()
    # serve_in_thread waits up to 30 s for the server thread: a shutdown that waited for
    # the stuck engine thread would take all of that.
    assert time.monotonic() - stopping < 10, "shutdown waited for the stuck engine thread"
    assert app.state.sessions.stuck_calls == 1
    RELEASE.set()
    deadline = time.monotonic() + 10
    while app.state.sessions.stuck_calls and time.monotonic() < deadline:
        time.sleep(0.05)
    assert app.state.sessions.stuck_calls == 0  # the engine was closed once its call returned
    assert time.monotonic() - started < 60
