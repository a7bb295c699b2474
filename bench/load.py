"""Load: concurrent sessions on one env server, over HTTP (wire API v1) and over OpenEnv's
WebSocket (``/ws``), rising until p99 latency passes 2 s (issue 62 item 5).

    python bench/load.py --env choice [--transports http ws]
        [--sessions 16 64 128 256 512 1024 2048 4096] [--seconds 15] [--json out.json]

One ``agentgym serve ENV`` process per transport, with its default engine workers (engine
threads for ``choice``, one worker process per core for textworld) and ``--max-sessions``
the highest level. At each level all sessions are opened at once; then each plays a closed loop (no
think time) for ``--seconds``: a step, and a reset whenever the step ended the episode
(every step of ``choice``, a one-turn env; never on textworld, whose sessions alternate
``look`` and ``inventory`` on an endless episode, as in bench/server.py). Over HTTP each
session has its own keep-alive connection driven by bench/server.py's lean load generator;
over ``/ws`` its own WebSocket (the ``websockets`` client). The load generator is this
process (one uvloop event loop) and shares the machine's cores with the server: its CPU
is reported beside the server's (the server process, and its engine workers). Rising
stops after the first level whose step or reset p99 passes the limit. Memory is the
server's RSS with its workers, the peak sampled every second. Figures go to
bench/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil
import uvloop
from websockets.asyncio.client import ClientConnection, connect

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: share bench/server.py's helpers
from server import ACTIONS, ENDLESS, RawConnection, _test_task_ids, cpu_seconds, percentile, prepare, tree_rss

from agentgym.servers.launcher import start_server_process, wait_healthy

LIMIT_S = 2.0
"""The p99 latency (of steps, or of resets) where rising stops (the issue's goal: p99 under 2 s)."""
ENV_ACTIONS = {"choice": ("blue",)}
"""The actions a session cycles through, by env (else bench/server.py's look and inventory)."""
MIB = 1024 * 1024


class Driven(Protocol):
    """One session as the load generator drives it."""

    async def open(self) -> None: ...
    async def step(self, action: str) -> bool:
        """Play ``action``; whether the episode ended."""
        ...

    async def reset(self) -> None: ...
    async def close(self) -> None: ...


class HttpSession:
    """A v1 session on its own keep-alive connection."""

    def __init__(self, url: str, start: dict[str, Any]) -> None:
        self.connection = RawConnection(url)
        self.start = json.dumps(start).encode()
        self.path = ""

    async def open(self) -> None:
        await self.connection.__aenter__()
        created = json.loads(
            await self.connection.send(self.connection.encode("POST", "/sessions", self.start))
        )
        self.path = f"/sessions/{created['session_id']}"

    async def step(self, action: str) -> bool:
        body = json.dumps({"action": action}).encode()
        result = json.loads(
            await self.connection.send(self.connection.encode("POST", f"{self.path}/step", body))
        )
        return result["terminated"] or result["truncated"]

    async def reset(self) -> None:
        await self.connection.send(self.connection.encode("POST", f"{self.path}/reset", self.start))

    async def close(self) -> None:
        with contextlib.suppress(Exception):  # a broken connection's session expires by the TTL
            if self.path:
                await self.connection.send(self.connection.encode("DELETE", self.path))
            await self.connection.__aexit__()


class WsSession:
    """An OpenEnv session: one WebSocket connection to ``/ws``."""

    def __init__(self, url: str, start: dict[str, Any]) -> None:
        self.url = "ws" + url.removeprefix("http") + "/ws"
        self.start = start
        self.socket: ClientConnection | None = None

    async def open(self) -> None:
        # no keep-alive pings: every second of the run is a request in flight anyway
        self.socket = await connect(self.url, ping_interval=None, open_timeout=120, max_size=None)
        await self.reset()

    async def ask(self, kind: str, data: dict[str, Any]) -> dict[str, Any]:
        assert self.socket is not None
        await self.socket.send(json.dumps({"type": kind, "data": data}))
        reply = json.loads(await self.socket.recv())
        if reply["type"] == "error":
            raise RuntimeError(f"{reply['data']['code']}: {reply['data']['message']}")
        return reply["data"]

    async def step(self, action: str) -> bool:
        return (await self.ask("step", {"action": action}))["done"]

    async def reset(self) -> None:
        await self.ask("reset", self.start)

    async def close(self) -> None:
        if self.socket is not None:
            await self.socket.close()


TRANSPORTS: dict[str, type[HttpSession] | type[WsSession]] = {"http": HttpSession, "ws": WsSession}


@dataclass
class Calls:
    """What the sessions of one level recorded."""

    steps: list[float] = field(default_factory=list)
    resets: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


@dataclass
class Level:
    env: str
    transport: str
    sessions: int
    seconds: float
    open_s: float
    steps: int
    resets: int
    errors: int
    first_errors: list[str]
    step_p50_ms: float
    step_p99_ms: float
    reset_p99_ms: float
    rss_peak_mib: float
    server_cpu: float
    """Cores the server process used over the run (1.0: one whole core)."""
    workers_cpu: float
    """Cores its engine worker processes used."""
    generator_cpu: float
    """Cores this process (the load generator) used."""

    def line(self) -> str:
        calls = (self.steps + self.resets) / self.seconds
        return (
            f"{self.env} {self.transport:<4} {self.sessions:>4} sessions ({self.sessions / psutil.cpu_count():g}/core)"
            f" | {calls:7.1f} calls/s | step p50 {self.step_p50_ms:7.1f} ms p99 {self.step_p99_ms:7.1f} ms"
            f" | reset p99 {self.reset_p99_ms:7.1f} ms | errors {self.errors} | RSS peak {self.rss_peak_mib:.0f} MiB"
            f" | CPU server {self.server_cpu:.0%} workers {self.workers_cpu:.0%} load generator"
            f" {self.generator_cpu:.0%} | opened in {self.open_s:.1f} s"
        )


async def drive(session: Driven, actions: tuple[str, ...], deadline: float, calls: Calls) -> None:
    """Step (and reset after each episode's end) until ``deadline``; a failed call is counted
    and ends this session's loop (its connection may be gone)."""
    for turn in itertools.count():
        if time.perf_counter() >= deadline:
            return
        try:
            t0 = time.perf_counter()
            done = await session.step(actions[turn % len(actions)])
            calls.steps.append(time.perf_counter() - t0)
            if done:
                t0 = time.perf_counter()
                await session.reset()
                calls.resets.append(time.perf_counter() - t0)
        except Exception as exc:
            calls.errors[f"{type(exc).__name__}: {str(exc)[:120]}"] += 1
            return


@dataclass
class Usage:
    """CPU seconds used so far: by the server process, by each of its engine workers, and
    by this process (the load generator)."""

    server: float
    workers: dict[int, float]
    generator: float

    @classmethod
    def now(cls, pid: int) -> Usage:
        workers = {}
        for child in psutil.Process(pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                times = child.cpu_times()
                workers[child.pid] = times.user + times.system
        return cls(cpu_seconds(pid), workers, cpu_seconds())

    def cores_since(self, before: Usage, seconds: float) -> dict[str, float]:
        """Cores each part used from ``before`` to this reading, ``seconds`` apart."""
        workers = sum(t - before.workers.get(pid, 0.0) for pid, t in self.workers.items())
        return {
            "server_cpu": (self.server - before.server) / seconds,
            "workers_cpu": workers / seconds,
            "generator_cpu": (self.generator - before.generator) / seconds,
        }


async def sample_rss(pid: int, peak: list[int]) -> None:
    """Keep ``peak[0]`` at the highest RSS of the server and its workers, sampled each second."""
    while True:
        peak[0] = max(peak[0], tree_rss(pid))
        await asyncio.sleep(1)


async def open_all(sessions: list[Driven], calls: Calls) -> list[Driven]:
    """Open every session at once; those that opened (a failure is counted as an error)."""
    results = await asyncio.gather(*(s.open() for s in sessions), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            calls.errors[f"open: {type(result).__name__}: {str(result)[:120]}"] += 1
    return [s for s, result in zip(sessions, results, strict=True) if not isinstance(result, BaseException)]


async def run_level(
    url: str, pid: int, env: str, transport: str, task_ids: list[str], n: int, seconds: float
) -> Level:
    starts = [{"task_id": task_ids[i % len(task_ids)], "options": ENDLESS} for i in range(n)]
    sessions = [TRANSPORTS[transport](url, start) for start in starts]
    calls, peak = Calls(), [tree_rss(pid)]
    sampler = asyncio.create_task(sample_rss(pid, peak))
    t0 = time.perf_counter()
    live = await open_all(sessions, calls)
    open_s = time.perf_counter() - t0
    before, start = Usage.now(pid), time.perf_counter()
    actions = ENV_ACTIONS.get(env, ACTIONS)
    await asyncio.wait_for(
        asyncio.gather(*(drive(s, actions, start + seconds, calls) for s in live)), seconds + 120
    )
    elapsed = time.perf_counter() - start
    used = Usage.now(pid).cores_since(before, elapsed)
    sampler.cancel()
    await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)
    return Level(
        env, transport, n, elapsed, open_s, len(calls.steps), len(calls.resets), sum(calls.errors.values()),
        [e for e, _ in calls.errors.most_common(3)], percentile(calls.steps, 50), percentile(calls.steps, 99),
        percentile(calls.resets, 99), peak[0] / MIB, **used,
    )  # fmt: skip


def wait_idle(url: str, timeout: float = 60.0) -> None:
    """Wait until the server holds no session (a closed WebSocket's session closes a moment after)."""
    deadline = time.monotonic() + timeout
    while httpx.get(f"{url}/health").json()["sessions"] and time.monotonic() < deadline:
        time.sleep(0.2)


def rise(args: argparse.Namespace, transport: str) -> list[Level]:
    """The levels of one transport, on a server of its own (so that its memory figures
    start from a fresh process), until one passes the limit."""
    server = start_server_process(
        args.env, extra_args=["--log-level", "warning", "--max-sessions", str(max(args.sessions))]
    )
    levels: list[Level] = []
    try:
        wait_healthy(server.url, 300, server.process)
        task_ids = uvloop.run(_test_task_ids(server.url))
        prepare(args.env)
        print(f"{transport}: server RSS at rest {tree_rss(server.process.pid) / MIB:.0f} MiB", flush=True)
        for n in sorted(args.sessions):
            level = uvloop.run(
                run_level(server.url, server.process.pid, args.env, transport, task_ids, n, args.seconds)
            )
            levels.append(level)
            print(level.line(), *level.first_errors, sep="\n    ", flush=True)
            wait_idle(server.url)
            if max(level.step_p99_ms, level.reset_p99_ms) > args.limit_s * 1000:
                break
    finally:
        server.stop()
    return levels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="choice")
    parser.add_argument("--transports", nargs="+", default=["http", "ws"], choices=sorted(TRANSPORTS))
    parser.add_argument("--sessions", type=int, nargs="+", default=[16, 64, 128, 256, 512, 1024, 2048, 4096])
    parser.add_argument("--seconds", type=float, default=15.0, help="measuring time per level")
    parser.add_argument(
        "--limit-s", type=float, default=LIMIT_S, help="stop rising past this p99 latency (steps or resets)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    levels = [level for transport in args.transports for level in rise(args, transport)]
    print(f"load average after: {os.getloadavg()}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(level) for level in levels], indent=2))


if __name__ == "__main__":
    main()
