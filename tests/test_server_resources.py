"""Sessions free their engines: a server process's file descriptors and RSS return near
their baseline after hundreds of episodes (bench/server.py reports the 1,000-episode run)."""

from __future__ import annotations

import asyncio
import time

import httpx
import psutil

from agentgym.clients.env_client import AsyncEnvClient
from agentgym.servers.launcher import start_server_process, wait_healthy

MIB = 1024 * 1024


async def play_episodes(url: str, task_ids: list[str], episodes: int, concurrency: int = 8) -> None:
    async def worker(client: AsyncEnvClient, indices: range) -> None:
        for i in indices:
            created = await client.create(task_ids[i % len(task_ids)])
            info = created.info
            while "expert_action" in info:
                info = (await client.step(created.session_id, info["expert_action"])).info
            assert info["success"]
            await client.delete(created.session_id)

    async with AsyncEnvClient(url) as client:
        await asyncio.gather(*(worker(client, range(w, episodes, concurrency)) for w in range(concurrency)))


async def open_and_abandon(url: str, task_ids: list[str], count: int) -> None:
    async with AsyncEnvClient(url) as client:
        await asyncio.gather(*(client.create(task_ids[i % len(task_ids)]) for i in range(count)))


async def first_task_ids(url: str) -> list[str]:
    async with AsyncEnvClient(url) as client:
        return [task.task_id for task in (await client.tasks(split="test", limit=12)).tasks]


def run_cycle(
    url: str, task_ids: list[str], pid: int, episodes: int, abandoned: int, fds_cap: int | None
) -> None:
    """Play ``episodes`` to the end, open ``abandoned`` sessions and wait until the TTL frees them."""
    asyncio.run(play_episodes(url, task_ids, episodes))
    asyncio.run(open_and_abandon(url, task_ids, abandoned))
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        health = httpx.get(f"{url}/health").json()
        if health["sessions"] == 0 and (fds_cap is None or psutil.Process(pid).num_fds() <= fds_cap):
            return
        time.sleep(0.5)


def test_engines_are_freed_after_many_episodes_and_expiries() -> None:
    server = start_server_process("textworld", extra_args=["--log-level", "warning", "--ttl", "2"])
    try:
        wait_healthy(server.url, 180, server.process)
        process = psutil.Process(server.process.pid)
        task_ids = asyncio.run(first_task_ids(server.url))
        # Warm-up reaches the allocator's high-water mark (games cached, thread arenas grown).
        run_cycle(server.url, task_ids, server.process.pid, 48, 32, None)
        fds, rss = process.num_fds(), process.memory_info().rss

        run_cycle(server.url, task_ids, server.process.pid, 400, 32, fds + 4)

        assert httpx.get(f"{server.url}/health").json()["sessions"] == 0
        assert process.num_fds() <= fds + 4, (fds, process.num_fds())
        growth = (process.memory_info().rss - rss) / MIB
        assert growth < 25, f"RSS grew by {growth:.1f} MiB over 400 episodes + 32 expiries"
    finally:
        server.stop()
