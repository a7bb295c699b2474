"""Env-server overhead: steps/s and p50/p99 step latency at 1, 16 and 64 concurrent
sessions, over HTTP against the same engine pool driven without HTTP; then server RSS
(server and its engine workers) across 1,000 episodes.

    python bench/server.py [--env textworld] [--seconds 20] [--episodes 1000] [--json out.json]

The server runs as a separate process (`agentgym serve`), as in production; the load
generator is this process (one event loop on uvloop, as the servers run), and its CPU use
is reported, as is the server process's own CPU per HTTP step (its engine workers' not
included: what HTTP, routing and the IPC cost). HTTP is measured twice: through the
product's ``AsyncEnvClient`` (aiohttp), and through a lean load generator (pre-encoded
requests on raw keep-alive connections, as wrk-style tools send), since on a 2-core host
the load generator's CPU comes out of the engines' cores and the client's share of the
gap is not the server's. "In-process" is the same engine pool the server uses (its engine
worker processes for textworld, built the same way by ``engine_host``) driven by the same
number of concurrent callers through the session manager, without HTTP. Throughput and
latency measure steps alone: each session starts one test task with an unbounded turn
limit and alternates `look` and `inventory`, real engine steps (the engine recomputes the
admissible commands and the expert's plan every turn) that never end the episode, so
reset cost stays out of the step figures. The RSS check plays whole expert episodes
(create, play, delete). Figures go to bench/RESULTS.md by hand, with the machine they
were measured on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import itertools
import json
import re
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from urllib.parse import urlsplit

import psutil
import uvloop

from agentgym import registry
from agentgym.clients.env_client import AsyncEnvClient
from agentgym.servers.app import ServerConfig, engine_host
from agentgym.servers.launcher import start_server_process, wait_healthy
from agentgym.servers.sessions import Session, SessionManager

ENDLESS = {"max_turns": 100_000}
"""The longest turn limit the servers accept: episodes that never end within a run."""
ACTIONS = ("look", "inventory")
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")


@dataclass
class Figures:
    mode: str
    sessions: int
    steps: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds


def figures(mode: str, sessions: int, latencies: list[float], seconds: float) -> Figures:
    """Steps, wall time and latency percentiles of one measured run."""
    return Figures(
        mode, sessions, len(latencies), seconds, percentile(latencies, 50), percentile(latencies, 99)
    )


def percentile(samples: list[float], q: float) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000 if len(samples) > 1 else 0.0


async def in_process(env_name: str, task_ids: list[str], sessions: int, seconds: float) -> Figures:
    """The server's engine pool without HTTP: ``sessions`` concurrent callers in this process."""
    config = ServerConfig(env=env_name, max_sessions=256)
    catalog = registry.make(env_name)
    manager = SessionManager(engine_host(config, catalog), max_sessions=config.max_sessions)
    await manager.start()
    try:

        async def open_one(i: int) -> Session:
            session = await manager.open()
            await manager.call(session, "reset", task_id=task_ids[i % len(task_ids)], options=ENDLESS)
            return session

        opened = await asyncio.gather(*(open_one(i) for i in range(sessions)))
        latencies: list[float] = []

        async def step_until(session: Session, deadline: float) -> None:
            for turn in itertools.count():
                if time.perf_counter() >= deadline:
                    return
                t0 = time.perf_counter()
                await manager.call(session, "step", ACTIONS[turn % 2])
                latencies.append(time.perf_counter() - t0)

        start = time.perf_counter()
        await asyncio.gather(*(step_until(session, start + seconds) for session in opened))
        return figures("in-process", sessions, latencies, time.perf_counter() - start)
    finally:
        await manager.shutdown()
        catalog.close()


def prepare(env_name: str) -> None:
    """Finish the env's shared preparation (textworld: generate every game into the cache the
    server shares) before measuring, so no generation runs beside either mode."""
    catalog = registry.make(env_name)
    catalog.warm_up()
    store = getattr(catalog, "store", None)
    while store is not None and store.pending():
        time.sleep(1)
    catalog.close()


def tree_rss(pid: int) -> int:
    """Resident memory of a process and its descendants (a server and its engine workers)."""
    root = psutil.Process(pid)
    total = 0
    for process in [root, *root.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def cpu_seconds(pid: int | None = None) -> float:
    """CPU time (user + system) a process has used so far, children not included: by
    default this one's (the load generator's)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


class RawConnection:
    """The lean load generator: one keep-alive HTTP/1.1 connection, each request's head
    written by hand and each answer read by its Content-Length and checked for 2xx: about
    what a wrk-style tool costs per request, a fraction of aiohttp's request machinery.
    With ``session_id``, :meth:`step` plays that session's two actions, their requests
    encoded once."""

    def __init__(self, url: str, session_id: str | None = None) -> None:
        self.address = urlsplit(url)
        body = {action: json.dumps({"action": action}).encode() for action in ACTIONS}
        self.requests = {
            action: self.encode("POST", f"/sessions/{session_id}/step", data) for action, data in body.items()
        }

    def encode(self, method: str, path: str, body: bytes = b"") -> bytes:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.address.netloc}\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        return (head + "\r\n").encode() + body

    async def __aenter__(self) -> RawConnection:
        self.reader, self.writer = await asyncio.open_connection(self.address.hostname, self.address.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.writer.close()
        await self.writer.wait_closed()

    async def send(self, request: bytes) -> bytes:
        """Send an encoded request; the answer's body (RuntimeError unless 2xx)."""
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        found = CONTENT_LENGTH.search(head)
        body = await self.reader.readexactly(int(found[1])) if found else b""
        if not head.startswith(b"HTTP/1.1 2"):
            status = head.split(b"\r\n", 1)[0].decode()
            raise RuntimeError(f"answered {status}: {body[:200]!r}")
        return body

    async def step(self, action: str) -> None:
        await self.send(self.requests[action])


async def over_http(url: str, task_ids: list[str], sessions: int, seconds: float, lean: bool) -> Figures:
    """Open ``sessions`` sessions first, then step them all concurrently for ``seconds``:
    through ``AsyncEnvClient``, or (``lean``) over one :class:`RawConnection` each."""
    latencies: list[float] = []

    async def step_until(step: Callable[[str], Awaitable[object]], deadline: float) -> None:
        for turn in itertools.count():
            if time.perf_counter() >= deadline:
                return
            t0 = time.perf_counter()
            await step(ACTIONS[turn % 2])
            latencies.append(time.perf_counter() - t0)

    async with AsyncEnvClient(url, max_connections=sessions) as client, contextlib.AsyncExitStack() as stack:
        created = await asyncio.gather(
            *(client.create(task_ids[i % len(task_ids)], options=ENDLESS) for i in range(sessions))
        )
        if lean:
            connections = [await stack.enter_async_context(RawConnection(url, c.session_id)) for c in created]
            steppers = [connection.step for connection in connections]
        else:
            steppers = [functools.partial(client.step, c.session_id) for c in created]
        start = time.perf_counter()
        await asyncio.gather(*(step_until(step, start + seconds) for step in steppers))
        elapsed = time.perf_counter() - start
        await stack.aclose()
        await asyncio.gather(*(client.delete(c.session_id) for c in created))
    return figures("http, lean load generator" if lean else "http", sessions, latencies, elapsed)


async def episodes_rss(url: str, pid: int, task_ids: list[str], episodes: int, concurrency: int = 8) -> dict:
    """Create, play to the end and delete ``episodes`` sessions; RSS before, peak, after."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(episodes):
        queue.put_nowait(i)
    peak = 0

    async def worker(client: AsyncEnvClient) -> None:
        nonlocal peak
        while not queue.empty():
            i = queue.get_nowait()
            created = await client.create(task_ids[i % len(task_ids)])
            info = created.info
            while "expert_action" in info:
                info = (await client.step(created.session_id, info["expert_action"])).info
            await client.delete(created.session_id)
            peak = max(peak, tree_rss(pid))

    async with AsyncEnvClient(url) as client:
        await asyncio.gather(*(worker(client) for _ in range(min(concurrency, 64))))  # warm-up pass
        baseline = tree_rss(pid)
        for i in range(episodes):
            queue.put_nowait(i)
        start = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
        after = tree_rss(pid)
    mib = 1024 * 1024
    return {
        "episodes": episodes,
        "seconds": round(elapsed, 1),
        "rss_baseline_mib": round(baseline / mib, 1),
        "rss_peak_mib": round(peak / mib, 1),
        "rss_after_mib": round(after / mib, 1),
        "growth_mib": round((after - baseline) / mib, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="textworld")
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time per configuration")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--episodes", type=int, default=1000, help="episodes for the RSS check (0 skips)")
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    server = start_server_process(
        args.env,
        extra_args=[
            "--log-level",
            "warning",
            "--max-sessions",
            "256",
        ],
    )
    try:
        wait_healthy(server.url, 300, server.process)
        task_ids = uvloop.run(_test_task_ids(server.url))
        prepare(args.env)
        rows = []
        for sessions in args.sessions:
            local = uvloop.run(in_process(args.env, task_ids, sessions, args.seconds))
            row = [local]
            print(
                f"{sessions:>3} sessions | in-process {local.steps_per_s:7.1f} steps/s p50 {local.p50_ms:6.2f} ms"
                f" p99 {local.p99_ms:6.2f} ms",
                flush=True,
            )
            for lean in (False, True):
                cpu, server_cpu = cpu_seconds(), cpu_seconds(server.process.pid)
                remote = uvloop.run(over_http(server.url, task_ids, sessions, args.seconds, lean))
                client_cpu = (cpu_seconds() - cpu) / remote.seconds
                server_ms = 1000 * (cpu_seconds(server.process.pid) - server_cpu) / remote.steps
                row.append(remote)
                print(
                    f"    {remote.mode:<27} {remote.steps_per_s:7.1f} steps/s p50 {remote.p50_ms:6.2f} ms"
                    f" p99 {remote.p99_ms:6.2f} ms | ÷ in-process {remote.steps_per_s / local.steps_per_s:5.1%}"
                    f" | added p50 {remote.p50_ms - local.p50_ms:+.2f} ms | load generator CPU {client_cpu:.0%}"
                    f" | server process CPU {server_ms:.2f} ms/step (workers not included)",
                    flush=True,
                )
            rows.append(row)
        memory = (
            uvloop.run(episodes_rss(server.url, server.process.pid, task_ids, args.episodes))
            if args.episodes
            else None
        )
        if memory:
            print(f"RSS over {memory['episodes']} episodes ({memory['seconds']} s): {memory}", flush=True)
    finally:
        server.stop()
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": [[asdict(f) for f in row] for row in rows], "memory": memory}, fh, indent=2)


async def _test_task_ids(url: str) -> list[str]:
    async with AsyncEnvClient(url) as client:
        return [task.task_id for task in (await client.tasks(split="test", limit=10_000)).tasks]


if __name__ == "__main__":
    main()
