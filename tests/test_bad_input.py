"""Issue 19, defects 1 and 3: input no engine can take is refused with a 4xx before any
engine sees it; the session survives, the server lives, the engine-error metric stays put.
Also item 6: malformed HTTP (bodies, methods, auth schemes, racing deletes) gets documented codes.

The textworld server runs as a child process here (not in a thread of pytest): a
Z-machine segfault must show up as a dead server and a failed assertion, not kill pytest.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import BinaryIO

import httpx
import pytest

from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import ServerProcess, serve_in_thread, start_server_process, wait_healthy
from conftest import engine_errors, send_raw

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
        status, body = send_raw(http, "POST", f"/sessions/{sid}/step", {"action": action})
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
        status, body = send_raw(http, "POST", "/step", {"id": compat_id, "action": "look\u0000north"})
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
        status, body = send_raw(http, "POST", "/sessions", f'{{"options": {options}}}')
        assert status == 422 and body["error"]["code"] == "validation_error", body
        assert http.get("/health").json()["sessions"] == sessions  # nothing half-built left behind
        path = f"/sessions/{existing['session_id']}/reset"
        status, body = send_raw(http, "POST", path, f'{{"options": {options}}}')
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
            status, body = send_raw(http, "POST", "/sessions", {"task_id": task_id})
            assert status == 404 and body["error"]["code"] == "task_not_found", body
        assert engine_errors(http) == 0


# ----- issue 19 item 6: the HTTP layer answers every malformed request with a documented code


def chunks(total: int, size: int = 8192) -> Iterator[bytes]:
    """A body sent chunked (no content-length), so only the streaming check can see its size."""
    for start in range(0, total, size):
        yield b" " * min(size, total - start)


UNPARSEABLE = {
    "not UTF-8": b'{"action": "\xff\xfe"}',
    "a 5000-digit integer": b'{"seed": 1' + b"0" * 5000 + b"}",
    "nested 20000 deep": b'{"options": {"a": ' + b"[" * 20000 + b"]" * 20000 + b"}}",
}


@pytest.mark.parametrize("body", list(UNPARSEABLE.values()), ids=list(UNPARSEABLE))
def test_unparseable_bodies_are_400_invalid_payload(choice_url: str, body: bytes) -> None:
    with httpx.Client(base_url=choice_url, timeout=HANG_TIMEOUT_S) as http:
        status, answer = send_raw(http, "POST", "/sessions", body)
        assert status == 400 and answer["error"]["code"] == "invalid_payload", answer


def test_a_chunked_body_over_the_limit_is_413(choice_url: str) -> None:
    with httpx.Client(base_url=choice_url, timeout=HANG_TIMEOUT_S) as http:
        response = http.post(
            "/sessions", content=chunks(65 * 1024), headers={"content-type": "application/json"}
        )
        assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
        session_id = http.post("/sessions", json={}).json()["session_id"]
        # A JSON step takes the step lane, which FastAPI's stack never sees: the limit holds there too.
        for body in (chunks(65 * 1024), json.dumps({"action": "a" * 65 * 1024})):
            step = http.post(
                f"/sessions/{session_id}/step", content=body, headers={"content-type": "application/json"}
            )
            assert step.status_code == 413 and step.json()["error"]["code"] == "payload_too_large"
        assert http.post(f"/sessions/{session_id}/step", json={"action": "look"}).status_code == 200


def test_made_up_methods_are_405_and_add_no_metric_labels(choice_url: str) -> None:
    with httpx.Client(base_url=choice_url, timeout=HANG_TIMEOUT_S) as http:
        for method in ("FROB", "XYZZY1", "PUT"):
            response = http.request(method, "/health")
            assert response.status_code == 405, response.text
            assert response.json()["error"]["code"] == "method_not_allowed"
        metrics = http.get("/metrics").text
        assert 'method="FROB"' not in metrics and 'method="XYZZY1"' not in metrics
        assert 'method="other"' in metrics and 'method="PUT"' in metrics


def test_a_made_up_method_split_across_packets_on_a_kept_alive_connection_is_405(choice_url: str) -> None:
    """The fast parser refuses FROB mid-token: the request, from its first byte (sent in an
    earlier packet), must reach the app; the connection then closes (h11 answered it, and
    h11 does not hold the head limits), and a new one serves."""
    host, port = choice_url.removeprefix("http://").split(":")
    health = f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    with socket.create_connection((host, int(port)), timeout=HANG_TIMEOUT_S) as sock:
        reader = sock.makefile("rb")
        sock.sendall(health)
        assert read_response(reader)[0] == 200
        sock.sendall(b"FR")
        time.sleep(0.2)  # a separate packet, parsed on its own
        sock.sendall(f"OB /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
        status, body = read_response(reader)
        assert status == 405 and json.loads(body)["error"]["code"] == "method_not_allowed", body
        assert reader.read() == b""  # closed by the server
    with socket.create_connection((host, int(port)), timeout=HANG_TIMEOUT_S) as sock:
        sock.sendall(health)
        assert read_response(sock.makefile("rb"))[0] == 200


def read_response(reader: BinaryIO) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response with a content-length."""
    status = int(reader.readline().split()[1])
    headers = dict(
        line.decode().lower().rstrip("\r\n").split(": ", 1) for line in iter(reader.readline, b"\r\n")
    )
    return status, reader.read(int(headers["content-length"]))


def test_concurrent_deletes_of_one_session_answer_one_204(choice_url: str) -> None:
    async def delete_eight_times() -> list[int]:
        async with httpx.AsyncClient(base_url=choice_url, timeout=HANG_TIMEOUT_S) as http:
            sid = (await http.post("/sessions", json={})).json()["session_id"]
            answers = await asyncio.gather(*(http.delete(f"/sessions/{sid}") for _ in range(8)))
        return sorted(a.status_code for a in answers)

    assert asyncio.run(delete_eight_times()) == [204] + [404] * 7


def test_the_bearer_scheme_is_case_insensitive() -> None:
    with serve_in_thread(ServerConfig(env="choice", token="s3cret")) as url:
        for scheme in ("Bearer", "bearer", "BEARER"):
            response = httpx.get(f"{url}/metadata", headers={"authorization": f"{scheme} s3cret"})
            assert response.status_code == 200, scheme
        for header in ("bearer wrong", "Basic s3cret", "s3cret", "Bearers3cret"):
            assert httpx.get(f"{url}/metadata", headers={"authorization": header}).status_code == 401
        # The step lane answers JSON steps before FastAPI's stack, behind the same token check.
        created = httpx.post(f"{url}/sessions", json={}, headers={"authorization": "Bearer s3cret"}).json()
        step = f"{url}/sessions/{created['session_id']}/step"
        assert httpx.post(step, json={"action": "look"}).status_code == 401
        assert (
            httpx.post(step, json={"action": "look"}, headers={"authorization": "bearer s3cret"}).status_code
            == 200
        )
