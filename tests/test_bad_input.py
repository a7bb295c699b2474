"""Issue 19, defects 1 and 3: input no engine can take is refused with a 4xx before any
engine sees it; the session survives, the server lives, the engine-error metric stays put.

The textworld server runs as a child process here (not in a thread of pytest): a
Z-machine segfault must show up as a dead server and a failed assertion, not kill pytest.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import ServerProcess, serve_in_thread, start_server_process, wait_healthy

HANG_TIMEOUT_S = 30.0
"""Generous: a step takes milliseconds, so a reply this late means the engine hangs."""


@pytest.fixture(scope="module")
def textworld_servers(agentgym_cache: str) -> Iterator[list[ServerProcess]]:
    """The module's textworld server processes (one, unless a test killed it)."""
    servers: list[ServerProcess] = []
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def textworld_process(textworld_servers: list[ServerProcess]) -> ServerProcess:
    """A live textworld server process: the module's, or a new one if a test crashed it
    (so on a build that crashes, each test fails on its own assertion)."""
    if not textworld_servers or textworld_servers[-1].process.poll() is not None:
        server = start_server_process("textworld")
        textworld_servers.append(server)
        wait_healthy(server.url, timeout=180, process=server.process)
    return textworld_servers[-1]


def engine_errors(http: httpx.Client) -> float:
    """The server's ``agentgym_sessions_engine_errors`` gauge."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("agentgym_sessions_engine_errors{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no engine-error metric")


def send(http: httpx.Client, method: str, path: str, body: object | str) -> tuple[int | None, dict]:
    """(status, JSON body) of a request; (None, {}) when the server died or hung on it,
    so that a crash fails the test's assertion instead of raising out of it."""
    content = body if isinstance(body, str) else json.dumps(body)
    try:
        response = http.request(method, path, content=content, headers={"content-type": "application/json"})
    except httpx.TransportError:
        return None, {}
    return response.status_code, response.json()


BAD_ACTIONS = {
    "NUL inside": "look\u0000north",  # segfaulted jericho's Z-machine
    "shift-out after a letter": "\u00c5\u0015",  # schemathesis' find: segfault
    "control at the end": "look\u000e",  # segfault
    "lone NUL": "\u0000",  # hung the engine thread
    "frotz meta-command": "\\hello",  # hung: frotz waits for more input
    "lone surrogate": "look \ud800",  # 503 engine_failed
    "multibyte over 198 bytes": "a" + "\u00e9" * 120,  # jericho cut it mid-character: 503
    "ASCII over 198 bytes": "go " + "north " * 40,  # jericho cut it silently: a different command
}


@pytest.mark.parametrize("action", list(BAD_ACTIONS.values()), ids=list(BAD_ACTIONS))
def test_textworld_refuses_actions_the_z_machine_cannot_take_and_the_session_still_steps(
    textworld_process: ServerProcess, action: str
) -> None:
    with httpx.Client(base_url=textworld_process.url, timeout=HANG_TIMEOUT_S) as http:
        created = http.post("/sessions", json={"split": "test", "index": 0}).json()
        sid, errors_before = created["session_id"], engine_errors(http)
        status, body = send(http, "POST", f"/sessions/{sid}/step", {"action": action})
        assert status == 400, body
        assert body["error"]["code"] == "invalid_action"
        assert textworld_process.process.poll() is None, "the server process died"
        step = http.post(f"/sessions/{sid}/step", json={"action": created["info"]["expert_action"]})
        assert step.status_code == 200 and step.json()["info"]["turn"] == 1
        assert engine_errors(http) == errors_before
        http.delete(f"/sessions/{sid}")


def test_textworld_still_takes_what_the_rules_normalise(textworld_process: ServerProcess) -> None:
    """Full-width letters fold to ASCII (NFKC) and surrounding whitespace goes: same command."""
    with httpx.Client(base_url=textworld_process.url, timeout=HANG_TIMEOUT_S) as http:
        created = http.post("/sessions", json={"split": "test", "index": 0}).json()
        step = http.post(f"/sessions/{created['session_id']}/step", json={"action": "  ｌｏｏｋ \n"})
        assert step.status_code == 200, step.text
        assert step.json()["observation"].startswith("-=")  # a room description, not "not a verb"
        http.delete(f"/sessions/{created['session_id']}")


def test_compat_step_refuses_the_same_actions(textworld_process: ServerProcess) -> None:
    with httpx.Client(base_url=textworld_process.url, timeout=HANG_TIMEOUT_S) as http:
        compat_id = http.post("/create").json()["id"]
        assert http.post("/reset", json={"id": compat_id, "data_idx": 0}).status_code == 200
        status, body = send(http, "POST", "/step", {"id": compat_id, "action": "look\u0000north"})
        assert status == 400 and body["error"]["code"] == "invalid_action", body
        assert http.post("/step", json={"id": compat_id, "action": "look"}).status_code == 200
        http.post("/close", json={"id": compat_id})


BAD_OPTIONS = {
    "max_turns a string": '{"max_turns": "x"}',
    "max_turns a list": '{"max_turns": [1]}',
    "max_turns 1e999": '{"max_turns": 1e999}',
    "max_turns NaN": '{"max_turns": NaN}',
    "max_turns fractional": '{"max_turns": 0.5}',
    "max_turns a bool": '{"max_turns": true}',
    "index a string": '{"split": "test", "index": "x"}',
    "index negative": '{"split": "test", "index": -1}',
    "split a list": '{"split": []}',
}


@pytest.mark.parametrize("options", list(BAD_OPTIONS.values()), ids=list(BAD_OPTIONS))
def test_bad_reset_options_are_422_and_cost_no_session(textworld_url: str, options: str) -> None:
    with httpx.Client(base_url=textworld_url, timeout=HANG_TIMEOUT_S) as http:
        existing = http.post("/sessions", json={"split": "test", "index": 1}).json()
        sessions, errors_before = http.get("/health").json()["sessions"], engine_errors(http)
        status, body = send(http, "POST", "/sessions", f'{{"options": {options}}}')
        assert status == 422 and body["error"]["code"] == "validation_error", body
        assert http.get("/health").json()["sessions"] == sessions  # nothing half-built left behind
        path = f"/sessions/{existing['session_id']}/reset"
        status, body = send(http, "POST", path, f'{{"options": {options}}}')
        assert status == 422 and body["error"]["code"] == "validation_error", body
        step = http.post(f"/sessions/{existing['session_id']}/step", json={"action": "look"})
        assert step.status_code == 200, step.text
        assert engine_errors(http) == errors_before
        http.delete(f"/sessions/{existing['session_id']}")


def test_good_options_still_work(textworld_url: str) -> None:
    with httpx.Client(base_url=textworld_url, timeout=HANG_TIMEOUT_S) as http:
        created = http.post("/sessions", json={"options": {"max_turns": 2.0, "split": "test", "index": 1}})
        assert created.status_code == 201, created.text
        assert created.json()["info"]["max_turns"] == 2
        http.delete(f"/sessions/{created.json()['session_id']}")


def test_sciworld_task_id_with_a_non_ascii_digit_is_404() -> None:
    """'²'.isdigit() is True but int('²') fails: that was a 503 and an engine error."""
    config = ServerConfig(env="sciworld", env_config={"spare_jvms": 0, "max_jvms": 1})
    with serve_in_thread(config) as url, httpx.Client(base_url=url, timeout=HANG_TIMEOUT_S) as http:
        for task_id in ("boil/²", "boil/٣", "boil/" + "9" * 5000):
            status, body = send(http, "POST", "/sessions", {"task_id": task_id})
            assert status == 404 and body["error"]["code"] == "task_not_found", body
        assert engine_errors(http) == 0
