"""Issue 40 item 2: the AgentGym-compatible integer ids reach only the session they name.

Every session used to get a counted id from 0, so ``/observation``, ``/step`` and ``/close``
with ``env_idx=k`` read, stepped and closed any session, v1 and OpenEnv ones too, and a
restarted server gave an old id to someone else's session. Now an id is random in
[1, 2^53), only ``/create`` gives one, and an id that names nothing is 404. Real servers
on loopback; a scan of 10,000 ids runs in a few seconds.
"""

from __future__ import annotations

import json
import re
import socket
from collections import Counter

import httpx
from websockets.sync.client import connect as websocket_connect

from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.launcher import serve_in_thread

SCAN = 10_000


def legacy_session(http: httpx.Client) -> int:
    """A session opened and reset through AgentGym's routes; its integer id."""
    compat_id = http.post("/create").json()["id"]
    assert http.post("/reset", json={"id": compat_id, "data_idx": 0}).status_code == 200
    return compat_id


def statuses(url: str, ids: list[int]) -> Counter[int]:
    """The statuses of ``GET /observation?env_idx=i`` for every id, pipelined on one
    connection (a client library's own cost would make the scan take half a minute)."""
    host, port = url.removeprefix("http://").split(":")
    requests = [f"GET /observation?env_idx={i} HTTP/1.1\r\nHost: {host}\r\n\r\n" for i in ids]
    requests.append(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
    answer = bytearray()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall("".join(requests).encode())
        while chunk := sock.recv(1 << 16):
            answer += chunk
    counted = Counter(int(status) for status in re.findall(rb"HTTP/1.1 (\d{3}) ", answer))
    counted[200] -= 1  # /health
    return +counted


def test_scanning_ten_thousand_ids_around_a_live_one_reaches_no_session() -> None:
    app = create_app(ServerConfig(env="choice"))
    with (
        serve_in_thread(app) as url,
        httpx.Client(base_url=url, timeout=30) as http,
        websocket_connect("ws" + url.removeprefix("http") + "/ws") as websocket,
    ):
        live = legacy_session(http)
        bystanders = [legacy_session(http), legacy_session(http)]
        v1 = http.post("/sessions", json={"split": "test", "index": 0}).json()["session_id"]
        openenv = http.post("/openenv/reset", json={}).json()["observation"]["session_id"]
        websocket.send(json.dumps({"type": "state"}))
        over_ws = json.loads(websocket.recv())["data"]["episode_id"]
        # Around the live id, and where counted ids used to be (the v1, OpenEnv and /ws sessions').
        ids = [i for i in range(live - SCAN // 2, live + SCAN // 2) if i != live] + list(range(100))
        assert statuses(url, ids) == {404: len(ids)}
        assert all(1 <= i < 2**53 for i in [live, *bystanders])
        # No integer at all names a session created by another protocol.
        assert [app.state.sessions.get(s).compat_id for s in (v1, openenv, over_ws)] == [None] * 3
        # Every session is still there and steps.
        for compat_id in [live, *bystanders]:
            assert http.post("/step", json={"id": compat_id, "action": "blue"}).status_code == 200
        assert http.post(f"/sessions/{v1}/step", json={"action": "blue"}).status_code == 200
        assert http.get("/openenv/state", params={"session_id": openenv}).status_code == 200


def test_a_closed_id_and_an_id_from_before_a_restart_name_no_session() -> None:
    with serve_in_thread(ServerConfig(env="choice")) as url, httpx.Client(base_url=url, timeout=30) as http:
        before_restart = legacy_session(http)
        closed = legacy_session(http)
        assert http.post("/close", json={"id": closed}).status_code == 200
        stale = http.post("/step", json={"id": closed, "action": "blue"})
        assert stale.status_code == 404 and stale.json()["error"]["code"] == "session_not_found"
    with serve_in_thread(ServerConfig(env="choice")) as url, httpx.Client(base_url=url, timeout=30) as http:
        others = [legacy_session(http) for _ in range(3)]  # someone else's, on the restarted server
        for old in (before_restart, closed):
            assert old not in others
            response = http.get("/observation", params={"id": old})
            assert response.status_code == 404 and response.json()["error"]["code"] == "session_not_found"
