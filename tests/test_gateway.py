"""The gateway on real loopback servers: spreading, affinity, failover, compat ids, `up env=N`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.cli.fleet import parse_replica_urls
from agentgym.clients.env_client import AsyncEnvClient, EnvClient, RetryPolicy
from agentgym.conformance.runner import run_checks
from agentgym.contract.errors import AtCapacity, EngineError
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import (
    ServerProcess,
    free_port,
    serve_in_thread,
    start_server_process,
    wait_healthy,
)
from conftest import gateway_over, read_until, send_raw, start_up, stop_with_ctrl_c

HTTP = httpx.Client(timeout=30.0)
"""One pooled client for direct requests: ``httpx.get`` builds a client (and a TLS context) per call."""


@contextlib.contextmanager
def thread_replicas(count: int, max_sessions: int = 64) -> Iterator[list[str]]:
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(serve_in_thread(ServerConfig(env="choice", max_sessions=max_sessions)))
            for _ in range(count)
        ]


@pytest.fixture
def process_replicas() -> Iterator[list[ServerProcess]]:
    """Two choice servers as child processes, so that one can really be killed."""
    servers = [start_server_process("choice", extra_args=["--log-level", "warning"]) for _ in range(2)]
    try:
        for server in servers:
            wait_healthy(server.url, 60, server.process)
        yield servers
    finally:
        for server in servers:
            server.stop()


def replica_of(gateway_session_id: str, replicas: list[str]) -> tuple[str, str]:
    """(replica URL, the replica's own session id) for a session opened through the gateway:
    found by asking every replica directly, so the test does not trust the gateway's mapping."""
    local_id = gateway_session_id.split("-", 1)[1]
    holders = [url for url in replicas if HTTP.get(f"{url}/sessions/{local_id}").status_code == 200]
    assert len(holders) == 1, f"{gateway_session_id} lives on {holders}"
    return holders[0], local_id


async def open_sessions(url: str, count: int) -> list[str]:
    async with AsyncEnvClient(url) as client:
        created = await asyncio.gather(*(client.create(split="train", index=i) for i in range(count)))
    return [c.session_id for c in created]


def test_sessions_spread_over_replicas_and_every_call_lands_on_its_own() -> None:
    with thread_replicas(2) as replicas, gateway_over(replicas) as gateway:
        env_url = f"{gateway}/envs/choice"
        session_ids = asyncio.run(open_sessions(env_url, 40))
        homes = {sid: replica_of(sid, replicas) for sid in session_ids}
        spread = Counter(url for url, _ in homes.values())
        assert set(spread) == set(replicas) and min(spread.values()) >= 15, spread
        with EnvClient(env_url) as client:
            for sid, (home, local_id) in homes.items():
                assert client.state(sid).session_id == sid
                result = client.step(sid, "blue")
                assert result.terminated and result.info["success"]
                # the step ran on the home replica: only there did the episode end
                assert HTTP.get(f"{home}/sessions/{local_id}").json()["done"] is True
                client.delete(sid)
        assert [HTTP.get(f"{url}/health").json()["sessions"] for url in replicas] == [0, 0]


def test_dead_replica_answers_503_for_its_sessions_and_new_ones_go_to_the_survivor(
    process_replicas: list[ServerProcess],
) -> None:
    urls = [server.url for server in process_replicas]
    with gateway_over(urls) as gateway:
        env_url = f"{gateway}/envs/choice"
        homes = {sid: replica_of(sid, urls)[0] for sid in asyncio.run(open_sessions(env_url, 10))}
        victim, survivor = process_replicas
        victim.process.kill()
        victim.process.wait()
        with EnvClient(env_url) as client:
            for sid, home in homes.items():
                if home == victim.url:
                    response = HTTP.post(f"{env_url}/sessions/{sid}/step", json={"action": "blue"})
                    assert response.status_code == 503
                    assert response.json()["error"]["code"] == "engine_failed"
                    with pytest.raises(EngineError):
                        client.step(sid, "blue")
                else:
                    assert client.step(sid, "blue").info["success"]
            fresh = [client.create(split="test", index=0).session_id for _ in range(10)]
        assert {replica_of(sid, [survivor.url])[0] for sid in fresh} == {survivor.url}
        health = HTTP.get(f"{gateway}/health").json()
        assert health["status"] == "degraded"
        assert health["envs"]["choice"]["replicas"] == 2 and health["envs"]["choice"]["healthy"] == 1
        assert HTTP.get(f"{env_url}/health").json()["healthy"] == 1


def test_wire_api_checks_pass_through_the_gateway() -> None:
    with thread_replicas(2) as replicas, gateway_over(replicas) as gateway:
        failed = [r for r in run_checks(f"{gateway}/envs/choice") if not r.passed]
        assert not failed, failed


def test_compat_routes_send_integer_ids_to_their_replica() -> None:
    with thread_replicas(2) as replicas, gateway_over(replicas) as gateway:
        env_url = f"{gateway}/envs/choice"
        ids = [HTTP.post(f"{env_url}/create").json()["id"] for _ in range(4)]
        assert len(set(ids)) == 4
        assert [HTTP.get(f"{url}/health").json()["sessions"] for url in replicas] == [2, 2]
        for compat_id in ids:
            reset = HTTP.post(f"{env_url}/reset", json={"id": compat_id, "data_idx": 1}).json()
            assert reset["task_id"] == "choice/train/1"
            observed = HTTP.get(f"{env_url}/observation", params={"env_idx": compat_id})
            assert observed.json() == reset["observation"]
            assert HTTP.post(f"{env_url}/step", json={"id": compat_id, "action": "blue"}).json()["done"]
            assert HTTP.post(f"{env_url}/close", json={"env_idx": compat_id}).json()["id"] == compat_id
        assert [HTTP.get(f"{url}/health").json()["sessions"] for url in replicas] == [0, 0]


def test_errors_keep_the_wire_shape() -> None:
    with thread_replicas(2, max_sessions=1) as replicas, gateway_over(replicas) as gateway:
        unknown_env = HTTP.get(f"{gateway}/envs/nope/metadata")
        assert unknown_env.status_code == 404 and unknown_env.json()["error"]["code"] == "env_not_found"
        unknown_session = HTTP.get(f"{gateway}/envs/choice/sessions/0123abcd-ffff")
        assert unknown_session.json()["error"]["code"] == "session_not_found"
        with EnvClient(f"{gateway}/envs/choice", retry=RetryPolicy(attempts=1)) as client:
            client.create(), client.create()  # one per replica: both are now full
            full = HTTP.post(f"{gateway}/envs/choice/sessions", json={})
            assert full.status_code == 429 and "retry-after" in full.headers
            with pytest.raises(AtCapacity):
                client.create()


@dataclass
class UpRun:
    """A running `agentgym up choice=2`: the process, its output so far, the gateway port."""

    proc: subprocess.Popen
    output: str
    port: int

    @property
    def env_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/envs/choice"

    def healthy_replicas(self) -> int:
        return HTTP.get(f"http://127.0.0.1:{self.port}/health").json()["envs"]["choice"]["healthy"]


@pytest.fixture
def up_choice_2(tmp_path) -> Iterator[UpRun]:
    """`agentgym up choice=2` started and up (its table printed); killed if a test leaves it running."""
    port = free_port()
    proc = start_up(["choice=2", "--log-dir", str(tmp_path), "--gateway-port", str(port)])
    try:
        yield UpRun(proc, read_until(proc, "Ctrl-C", timeout=90), port)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_up_with_replicas_serves_through_a_gateway_and_stops_on_ctrl_c(up_choice_2: UpRun) -> None:
    run = up_choice_2
    assert f"choice: {run.env_url}" in run.output, run.output
    assert len(re.findall(r"^.*choice .*http://127\.0\.0\.1:\d+", run.output, re.M)) == 2, run.output
    with EnvClient(run.env_url) as client:
        session = client.create(split="test", index=0)
        assert client.step(session.session_id, "blue").info["success"]
    assert run.healthy_replicas() == 2
    children = psutil.Process(run.proc.pid).children(recursive=True)
    assert len(children) == 3
    stop_with_ctrl_c(run.proc, children, run.output)


def test_gateway_and_up_reject_bad_replica_specs(tmp_path) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["gateway"]).exit_code == 2  # no replicas at all
    result = runner.invoke(app, ["gateway", "--replica", "choice=localhost:1"])
    assert result.exit_code == 2 and "ENV=http://" in result.output
    for spec in ("choice=0", "choice=x", "no-such-env=2"):
        assert runner.invoke(app, ["up", spec]).exit_code == 2, spec
    config = tmp_path / "gateway.yaml"
    config.write_text("replicas:\n  choice: [http://a:1, http://b:2]\n  search: http://c:3\n")
    assert parse_replica_urls(["choice=http://d:4"], config) == {
        "choice": ["http://a:1", "http://b:2", "http://d:4"],
        "search": ["http://c:3"],
    }


MALFORMED_IDS = {
    "1e999": "1e999",  # was a 500
    "Infinity": "Infinity",  # was a reset connection
    "NaN": "NaN",
    "a fraction": "1.5",
    "negative": "-1",
    "a bool": "true",
    "a list": "[0]",
    "a word": '"zero"',
}


@pytest.mark.parametrize("value", list(MALFORMED_IDS.values()), ids=list(MALFORMED_IDS))
def test_malformed_compat_ids_are_422_at_the_gateway(value: str) -> None:
    with thread_replicas(2) as replicas, gateway_over(replicas) as gateway:
        for route in ("step", "reset", "close"):
            status, body = send_raw(
                HTTP, "POST", f"{gateway}/envs/choice/{route}", f'{{"id": {value}, "action": "x"}}'
            )
            assert status == 422 and body["error"]["code"] == "validation_error", (route, body)
        status, body = send_raw(HTTP, "GET", f"{gateway}/envs/choice/observation?id=x")
        assert status == 422 and body["error"]["code"] == "validation_error", body
        for not_an_object in (b"[1]", b"\xff", b"[" * 5000 + b"]" * 5000):
            status, body = send_raw(HTTP, "POST", f"{gateway}/envs/choice/step", not_an_object)
            assert status == 400 and body["error"]["code"] == "invalid_payload", body
        assert HTTP.get(f"{gateway}/health").json()["envs"]["choice"]["healthy"] == 2


def test_the_gateway_refuses_an_oversized_body_itself() -> None:
    """413 from the gateway, before forwarding: replicas that take bodies of 10 MiB never
    see a 100 KiB one (it used to be buffered whole and forwarded)."""
    big = ServerConfig(env="choice", max_body_bytes=10 * 1024 * 1024)
    with serve_in_thread(big) as replica, gateway_over([replica]) as gateway:
        body = json.dumps({"task_id": "x" * 100_000})
        for content in (body, iter([body.encode()])):  # with content-length, and chunked
            status, answer = send_raw(HTTP, "POST", f"{gateway}/envs/choice/sessions", content)
            assert status == 413 and answer["error"]["code"] == "payload_too_large", answer
        assert HTTP.post(f"{gateway}/envs/choice/sessions", json={}).status_code == 201


def test_up_restarts_a_replica_that_dies_and_the_gateway_keeps_serving(up_choice_2: UpRun) -> None:
    """Issue 19 defect 4: killing one replica under `up` used to stop everything within a second."""
    run = up_choice_2
    replicas = [c for c in psutil.Process(run.proc.pid).children() if "serve" in c.cmdline()]
    assert len(replicas) == 2, run.output
    with EnvClient(run.env_url, retry=RetryPolicy(attempts=1)) as client:
        sessions = [client.create(split="test", index=0) for _ in range(4)]  # spread over both
        replicas[0].kill()
        run.output += read_until(run.proc, "exited with code", timeout=30)
        assert "exited with code" in run.output and run.proc.poll() is None, run.output
        survivors = [s for s in sessions if _steps(client, s.session_id)]
        assert 1 <= len(survivors) < len(sessions)  # only the dead replica's sessions were lost
        assert client.step(client.create(split="test", index=0).session_id, "blue").info["success"]
        run.output += read_until(run.proc, "restarted", timeout=30)
        assert "choice restarted" in run.output, run.output
        deadline = time.monotonic() + 30
        while run.healthy_replicas() < 2:
            assert time.monotonic() < deadline, "the restarted replica never became healthy"
            time.sleep(0.3)
    stop_with_ctrl_c(run.proc, psutil.Process(run.proc.pid).children(recursive=True), run.output)


def _steps(client: EnvClient, session_id: str) -> bool:
    """Whether the session still answers a step (False once its replica is gone)."""
    try:
        return client.step(session_id, "blue").info["success"]
    except EngineError:
        return False
