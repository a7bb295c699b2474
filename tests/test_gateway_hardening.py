"""Issue 40, the gateway: it forwards any header a server accepts, nothing it forwards
reaches past a replica's base URL, it never redirects a client to a replica nor tells a
client a replica's address, its WebSocket relay says when a replica died, and compat ids
reach only the legacy sessions they name. Real servers on loopback, requests over HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as websocket_connect

from agentgym.servers.app import ServerConfig
from agentgym.servers.gateway import Replica
from agentgym.servers.launcher import (
    free_port,
    serve_in_thread,
    start_gateway_process,
    start_server_process,
    wait_healthy,
)
from conftest import gateway_over

HTTP = httpx.Client(timeout=30.0)


@contextlib.contextmanager
def choice_fleet(count: int) -> Iterator[tuple[str, list[str]]]:
    """``count`` choice replicas behind a gateway: (the gateway's env URL, replica URLs)."""
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(serve_in_thread(ServerConfig(env="choice"))) for _ in range(count)]
        yield f"{stack.enter_context(gateway_over(replicas))}/envs/choice", replicas


def error_code(response: httpx.Response) -> str:
    """The wire error's code; fails unless the body is the servers' error envelope."""
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    return body["error"]["code"]


def test_non_ascii_header_values_are_forwarded() -> None:
    """Was a 500 for any request: headers were copied into an HTTP client that encodes ASCII only."""
    headers = [("X-Name", "café".encode()), ("X-Raw", b"\xff\xfe")]
    with choice_fleet(1) as (env_url, [replica]):
        assert HTTP.get(f"{replica}/metadata", headers=headers).status_code == 200  # what a server takes
        assert HTTP.get(f"{env_url}/metadata", headers=headers).status_code == 200
        created = HTTP.post(f"{env_url}/sessions", json={"split": "test", "index": 0}, headers=headers)
        assert created.status_code == 201, created.text
        step = HTTP.post(
            f"{env_url}/sessions/{created.json()['session_id']}/step",
            json={"action": "blue"},
            headers=headers,
        )
        assert step.status_code == 200 and step.json()["info"]["success"], step.text


def fake_replica_under_a_prefix() -> FastAPI:
    """A replica served under ``/replica`` on a host that also serves ``/secret``: what a
    request escaping the replica's base URL would reach."""
    app = FastAPI()

    @app.get("/replica/health")
    def health() -> dict[str, object]:
        return {"status": "ok", "env": "choice", "sessions": 0, "capacity": 4}

    @app.get("/health")
    def root_health() -> dict[str, str]:
        return {"status": "ok"}

    @app.api_route("/secret", methods=["GET", "POST", "DELETE"])
    def secret() -> dict[str, str]:
        return {"secret": "leaked"}

    return app


ESCAPES = [
    "sessions/{key}-x%2F..%2F..%2F..%2Fsecret",  # decoded by the server before routing
    "sessions/{key}-x/%2E%2E/%2E%2E/%2E%2E/secret",
    "sessions/{key}-..%2F..%2Fsecret",  # a replica session id that is itself a dot segment
    "sessions/{key}-..",
    "..%2F..%2Fsecret",  # a session-less path
    "metadata%2F..%2F..%2F..%2Fsecret",
]


def test_encoded_dot_segments_never_reach_past_the_replica() -> None:
    """An encoded ``%2F..`` in a gateway path used to be resolved by the gateway's HTTP
    client after routing, so it reached any path on the replica's host."""
    with serve_in_thread(fake_replica_under_a_prefix()) as host, gateway_over([f"{host}/replica"]) as gateway:
        assert HTTP.get(f"{host}/secret").status_code == 200  # it is there to be reached
        key = Replica("choice", f"{host}/replica", 0).key
        for escape in ESCAPES:
            path = escape.format(key=key)
            for method in ("GET", "POST", "DELETE"):
                answer = HTTP.request(method, f"{gateway}/envs/choice/{path}")
                assert answer.status_code in (400, 404) and "leaked" not in answer.text, (method, path)


def test_a_path_that_traverses_is_refused_before_a_replica_is_chosen() -> None:
    """Resolved, ``sessions/KEY-x%2F..%2F..%2Fsessions`` was the create route (a session
    made where the gateway chose, through a session's path) and ``…%2Fmetrics`` a replica's
    metrics page: every path with a dot segment or an encoded separator is now a 400."""
    with choice_fleet(2) as (env_url, replicas):
        session_id = HTTP.post(f"{env_url}/sessions", json={}).json()["session_id"]
        key = session_id.partition("-")[0]
        before = [HTTP.get(f"{r}/health").json() for r in replicas]
        for method, path in [
            ("POST", f"sessions/{key}-x%2F..%2F..%2Fsessions"),
            ("GET", f"sessions/{key}-x%2F..%2F..%2Fmetrics"),
            ("GET", f"sessions/{key}-x%5C..%5C..%5Cmetrics"),
            ("GET", f"sessions/{key}-x/%2E%2E/%2E%2E/metrics"),  # (httpx resolves a plain `..` itself)
        ]:
            answer = HTTP.request(method, f"{env_url}/{path}", json={} if method == "POST" else None)
            assert answer.status_code == 400 and error_code(answer) == "invalid_path", (path, answer.text)
        assert [HTTP.get(f"{r}/health").json() for r in replicas] == before  # no session made
        assert HTTP.get(f"{env_url}/sessions/{session_id}").status_code == 200  # plain paths still route


def test_paths_are_forwarded_as_one_path() -> None:
    """``%3F`` became the replica's query string and ``%00`` a 500; the servers answer 404."""
    with choice_fleet(1) as (env_url, [replica]):
        for path in ("tasks%3Fsplit=nope", "tasks%23x", "a%00b", "sessions/abc-%00"):
            assert HTTP.get(f"{replica}/{path.removeprefix('sessions/abc-')}").status_code == 404
            answer = HTTP.get(f"{env_url}/{path}")
            assert answer.status_code == 404 and error_code(answer), (path, answer.text)


def test_a_trailing_slash_is_never_redirected_to_a_replica() -> None:
    """``POST /envs/choice/step/`` answered 307 to the replica's internal URL (the servers
    redirect to their own slashless route); the gateway's redirect names its own route."""
    with choice_fleet(1) as (env_url, [replica]):
        session_id = HTTP.post(f"{env_url}/sessions", json={"split": "test", "index": 0}).json()["session_id"]
        compat_id = HTTP.post(f"{env_url}/create").json()["id"]
        HTTP.post(f"{env_url}/reset", json={"id": compat_id, "data_idx": 0})
        calls = [
            ("POST", f"sessions/{session_id}/step/", {"action": "blue"}),
            ("POST", "step/", {"id": compat_id, "action": "blue"}),
            ("GET", "tasks/", None),
            ("GET", "sessions/", None),
        ]
        for method, path, body in calls:
            answer = HTTP.request(method, f"{env_url}/{path}", json=body)
            location = answer.headers.get("location", "")
            assert replica.removeprefix("http://") not in location, (path, location)
            assert location.startswith("/envs/choice/") and not location.endswith("/"), (path, location)
        with httpx.Client(base_url=env_url, follow_redirects=True, timeout=30) as client:
            session_id = client.post("/sessions", json={"split": "test", "index": 0}).json()["session_id"]
            assert client.post(f"/sessions/{session_id}/step/", json={"action": "blue"}).json()["terminated"]
            assert client.get("/tasks/").json()["tasks"]


def test_health_lists_replica_urls_only_to_the_token(monkeypatch: pytest.MonkeyPatch) -> None:
    """The unauthenticated ``/health`` listed every replica's internal URL, and an
    unreachable replica's URL was in the 503 any client got."""
    dead = f"http://127.0.0.1:{free_port()}"
    with serve_in_thread(ServerConfig(env="choice")) as live:
        monkeypatch.setenv("AGENTGYM_TOKEN", "s3cret")  # how `up` hands its token to the gateway
        gateway = start_gateway_process({"choice": [live, dead]})
        try:
            wait_healthy(gateway.url, 60, gateway.process)
            urls = [live.removeprefix("http://"), dead.removeprefix("http://")]
            for token in (None, "wrong"):
                headers = {"authorization": f"Bearer {token}"} if token else {}
                health = HTTP.get(f"{gateway.url}/health", headers=headers)
                assert health.json()["envs"]["choice"]["replicas"] == 2
                assert not [url for url in urls if url in health.text], health.text
            told = HTTP.get(f"{gateway.url}/health", headers={"authorization": "Bearer s3cret"}).json()
            assert [m["url"] for m in told["envs"]["choice"]["members"]] == [live, dead]
            lost = HTTP.get(f"{gateway.url}/envs/choice/sessions/{Replica('choice', dead, 1).key}-abc")
            assert lost.status_code == 503 and error_code(lost) == "engine_failed"
            assert urls[1] not in lost.text, lost.text
        finally:
            gateway.stop()


def test_the_websocket_relay_closes_with_1012_when_the_replica_dies() -> None:
    """A client whose replica was killed was closed with 1000 (normal closure)."""
    replica = start_server_process("choice", extra_args=["--log-level", "warning"])
    try:
        wait_healthy(replica.url, 60, replica.process)
        with gateway_over([replica.url]) as gateway:
            url = "ws://" + gateway.removeprefix("http://") + "/envs/choice/ws"
            with websocket_connect(url, open_timeout=10) as ws:
                ws.send(json.dumps({"type": "reset", "data": {"split": "test", "index": 0}}))
                assert json.loads(ws.recv(timeout=10))["type"] == "observation"
                os.kill(replica.process.pid, signal.SIGKILL)
                with pytest.raises(ConnectionClosed) as closed:
                    ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012, closed.value
    finally:
        replica.stop()


def test_compat_ids_through_the_gateway_reach_only_the_legacy_sessions_they_name() -> None:
    """Gateway ids were replica id * replicas + index over sequential replica ids, so a
    scan from 0 reached (and could step and close) every session, v1 ones included."""
    with choice_fleet(2) as (env_url, replicas):
        v1 = [HTTP.post(f"{env_url}/sessions", json={}).json()["session_id"] for _ in range(4)]
        HTTP.post(f"{env_url}/openenv/reset", json={})
        legacy = [HTTP.post(f"{env_url}/create").json()["id"] for _ in range(4)]
        assert len(set(legacy)) == 4 and all(1 <= i < 2**53 for i in legacy), legacy
        assert sorted(HTTP.get(f"{url}/health").json()["sessions"] for url in replicas) == [4, 5]
        around = {i + d for i in legacy for d in range(-50, 51) if i + d >= 0}
        probes = {*range(100), *around} - set(legacy)  # where sequential ids were, and around these
        for probe in sorted(probes):
            answer = HTTP.get(f"{env_url}/observation", params={"id": probe})
            assert answer.status_code == 404 and error_code(answer) == "session_not_found", probe
        for compat_id in legacy:  # each id is its own replica's: any gateway finds it
            with gateway_over(replicas) as restarted:
                reset = HTTP.post(f"{restarted}/envs/choice/reset", json={"id": compat_id, "data_idx": 1})
                assert reset.json()["task_id"] == "choice/train/1", reset.text
            assert HTTP.post(f"{env_url}/step", json={"id": compat_id, "action": "blue"}).json()["done"]
            assert HTTP.post(f"{env_url}/close", json={"id": compat_id}).status_code == 200
            gone = HTTP.post(f"{env_url}/step", json={"id": compat_id, "action": "blue"})
            assert gone.status_code == 404 and error_code(gone) == "session_not_found"
        for session_id in v1:  # untouched by all of the above
            assert HTTP.get(f"{env_url}/sessions/{session_id}").status_code == 200
