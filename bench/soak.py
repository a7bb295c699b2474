"""Soak: thousands of ``choice`` episodes through the gateway (``agentgym gateway``) in
front of two replicas, one replica killed (SIGKILL) midway and started again on its port
as a supervisor would (issue 62 item 5).

    python bench/soak.py [--episodes 10000] [--concurrency 32] [--warmup 500] [--json out.json]

Each episode creates a session through the gateway, plays the expert's action (``choice``
is one turn) and deletes the session, through ``AsyncEnvClient`` without retries, so every
failure counts. When half the episodes have started, replica 2 gets SIGKILL; a second
later (the supervisor's first backoff) it is started again on the same port, so the ids of
its lost sessions reach it again (and answer 404). An episode is **lost** when its create
succeeded and its step did not; each lost episode is put down to the replica its session id
names. A create the gateway could not place is counted apart (no episode began).

File descriptors, RSS, threads and child processes (engine workers) of every server process
(the gateway; each replica; the killed one's restart from when it is healthy again) are
read after ``--warmup`` episodes and at the end, once the sessions are closed and the
pools settled. Flat means: descriptors within :data:`FD_MARGIN`, RSS within
:data:`RSS_MARGIN` (or 10 MiB), child processes equal. Every process runs on this machine
(loopback, ports from the OS); the load generator is this process and its CPU is reported
with the servers'.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import uvloop

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: share bench/server.py's helpers
from server import cpu_seconds

from agentgym.clients.env_client import AsyncEnvClient, RetryPolicy
from agentgym.servers.launcher import ServerProcess, start_gateway_process, start_server_process, wait_healthy
from agentgym.servers.replicas import Replica

ENV = "choice"
FD_MARGIN = 2
"""Descriptors other than TCP sockets that may differ between two readings of an idle
process (a log file or a pipe opened at that moment); any more is a leak."""
RSS_MARGIN = 0.10
RESTART_AFTER_S = 1.0
"""The supervisor's first backoff (:class:`agentgym.servers.launcher.Supervisor`)."""
MIB = 1024 * 1024


@dataclass
class Outcomes:
    completed: int = 0
    lost: Counter[str] = field(default_factory=Counter)
    """Replica key -> episodes whose step failed."""
    deletes_failed: Counter[str] = field(default_factory=Counter)
    """Replica key -> episodes played whose delete failed (the session went with its replica)."""
    creates_failed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    """What failed, by stage and message."""

    def failed(self, stage: str, exc: Exception) -> None:
        self.errors[f"{stage}: {type(exc).__name__}: {str(exc)[:100]}"] += 1


def reading(pid: int) -> dict[str, Any]:
    """What a server process holds now: descriptors (and how many are TCP sockets), RSS,
    threads, child processes."""
    process = psutil.Process(pid)
    return {
        "pid": pid,
        "fds": process.num_fds(),
        "tcp": len(process.net_connections(kind="tcp")),
        "rss_mib": round(process.memory_info().rss / MIB, 1),
        "threads": process.num_threads(),
        "children": len(process.children(recursive=True)),
    }


def flat(start: dict[str, Any], end: dict[str, Any]) -> bool:
    """Descriptors other than TCP sockets within :data:`FD_MARGIN`, RSS within
    :data:`RSS_MARGIN` (or 10 MiB), the same child processes. TCP sockets are pooled
    keep-alive connections (bounded by the pools: reported, not judged)."""
    others = abs((end["fds"] - end["tcp"]) - (start["fds"] - start["tcp"]))
    rss_margin = max(10.0, RSS_MARGIN * start["rss_mib"])
    return (
        others <= FD_MARGIN
        and end["rss_mib"] - start["rss_mib"] <= rss_margin
        and end["children"] == start["children"]
    )


async def episode(client: AsyncEnvClient, task_id: str, outcomes: Outcomes) -> None:
    """Create, play and delete one episode, recording how it ended."""
    try:
        created = await client.create(task_id)
    except Exception as exc:
        outcomes.creates_failed += 1
        outcomes.failed("create", exc)
        return
    replica = created.session_id.split("-", 1)[0]
    try:
        await client.step(created.session_id, created.info["expert_action"])
    except Exception as exc:
        outcomes.lost[replica] += 1
        outcomes.failed("step", exc)
        return
    try:
        await client.delete(created.session_id)
    except Exception as exc:
        outcomes.deletes_failed[replica] += 1
        outcomes.failed("delete", exc)
    outcomes.completed += 1


async def play(
    url: str,
    task_ids: list[str],
    episodes: int,
    concurrency: int,
    halfway: Callable[[], Awaitable[None]] | None = None,
) -> tuple[Outcomes, float]:
    """``episodes`` episodes, ``concurrency`` at a time; ``halfway`` (a coroutine function)
    starts when half of them have started. The outcomes and the wall time."""
    outcomes, numbers, events = Outcomes(), itertools.count(), []

    async def worker(client: AsyncEnvClient) -> None:
        while (i := next(numbers)) < episodes:
            if i == episodes // 2 and halfway is not None:
                events.append(asyncio.create_task(halfway()))
            await episode(client, task_ids[i % len(task_ids)], outcomes)

    start = time.perf_counter()
    async with AsyncEnvClient(url, retry=RetryPolicy(attempts=1), max_connections=concurrency) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))
    await asyncio.gather(*events)
    return outcomes, time.perf_counter() - start


def kill_and_restart(replica: ServerProcess, log: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    """The halfway event: SIGKILL ``replica``, start it again after the backoff, note when."""

    async def event() -> None:
        log["killed"] = reading(replica.process.pid)
        t0 = time.perf_counter()
        replica.process.kill()
        await asyncio.to_thread(replica.process.wait)
        await asyncio.sleep(RESTART_AFTER_S)
        replica.restart()
        await asyncio.to_thread(wait_healthy, replica.url, 120, replica.process)
        log["down_s"] = round(time.perf_counter() - t0, 2)
        log["restarted"] = reading(replica.process.pid)

    return event


def settle(replicas: list[ServerProcess], timeout: float = 30.0) -> None:
    """Wait until no replica holds a session, then a little more for the pools."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(
        httpx.get(f"{r.url}/health").json()["sessions"] for r in replicas
    ):
        time.sleep(0.2)
    time.sleep(2)


def start_fleet() -> tuple[list[ServerProcess], ServerProcess]:
    """Two replicas of ``choice`` and a gateway in front of them, each on a port the OS chose."""
    replicas = [start_server_process(ENV, extra_args=["--log-level", "warning"]) for _ in range(2)]
    for replica in replicas:
        wait_healthy(replica.url, 120, replica.process)
    gateway = start_gateway_process({ENV: [r.url for r in replicas]})
    wait_healthy(gateway.url, 120, gateway.process)
    return replicas, gateway


def cores(processes: dict[str, ServerProcess]) -> dict[str, float]:
    """CPU seconds used so far by each process, and by this one (the load generator)."""
    return {name: cpu_seconds(p.process.pid) for name, p in processes.items()} | {
        "load generator": cpu_seconds()
    }


def soak(args: argparse.Namespace, replicas: list[ServerProcess], gateway: ServerProcess) -> dict[str, Any]:
    """Warm up, read every process, play the episodes with the kill and restart halfway,
    read them again; the figures."""
    url, task_ids = f"{gateway.url}/envs/{ENV}", [f"{ENV}/test/{i}" for i in range(32)]
    uvloop.run(play(url, task_ids, args.warmup, args.concurrency))
    settle(replicas)
    survivor, victim = replicas
    processes = {"gateway": gateway, "replica 1": survivor}
    start, event = {name: reading(p.process.pid) for name, p in processes.items()}, {}
    start["replica 2, killed"] = reading(victim.process.pid)
    before = cores(processes)  # the killed replica's CPU goes with its process
    outcomes, seconds = uvloop.run(
        play(url, task_ids, args.episodes, args.concurrency, kill_and_restart(victim, event))
    )
    used = {name: round((t - before[name]) / seconds, 2) for name, t in cores(processes).items()}
    settle(replicas)
    end = {name: reading(p.process.pid) for name, p in processes.items()}
    end["replica 2, killed"] = event["killed"]  # read under load, just before the kill
    start["replica 2, restarted"], end["replica 2, restarted"] = (
        event["restarted"],
        reading(victim.process.pid),
    )
    keys = {Replica(ENV, r.url, i).key: f"replica {i + 1}" for i, r in enumerate(replicas)}
    return {
        "episodes": args.episodes,
        "concurrency": args.concurrency,
        "seconds": round(seconds, 1),
        "episodes_per_s": round(args.episodes / seconds, 1),
        "completed": outcomes.completed,
        "lost": {keys.get(k, k): n for k, n in outcomes.lost.items()},
        "deletes_failed": {keys.get(k, k): n for k, n in outcomes.deletes_failed.items()},
        "creates_failed": outcomes.creates_failed,
        "errors": dict(outcomes.errors.most_common(6)),
        "replica_2_down_s": event["down_s"],
        "cores_used": used,
        "processes": {
            name: {"start": start[name], "end": end[name], "flat": flat(start[name], end[name])}
            for name in start
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}", flush=True)
    replicas, gateway = start_fleet()
    try:
        figures = soak(args, replicas, gateway)
    finally:
        for server in [gateway, *replicas]:
            server.stop()
    print(json.dumps(figures, indent=1), f"load average after: {os.getloadavg()}", sep="\n", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
