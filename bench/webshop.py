"""WebShop figures: catalog generation and index build, search latency, one server under
32 concurrent sessions, and the expert's success in browser mode.

    python bench/webshop.py [--products 50000] [--sessions 32] [--seconds 20]
                            [--browser-tasks 20] [--json out.json]

1. Generate the catalog and build its tantivy index in a fresh cache folder (timed), then
   reopen it (timed).
2. Search latency: p50/p99 over goal instructions and product titles, in-process.
3. One `agentgym serve webshop` process on the same catalog; ``--sessions`` sessions play
   expert episodes back to back over HTTP for ``--seconds``: steps/s, episodes/s, step
   latency p50/p99, success rate.
4. Browser mode: the expert plays the first ``--browser-tasks`` test tasks through
   chromium on that server's website: success rate and seconds per step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from agentgym.clients.env_client import AsyncEnvClient
from agentgym.servers.launcher import start_server_process, wait_healthy


def percentile_ms(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000


def build_figures(products: int, n_test: int) -> tuple[Any, dict[str, float]]:
    from agentgym.contract.cache import cache_dir
    from agentgym.envs.webshop.catalog import generate_catalog
    from agentgym.envs.webshop.search import SearchIndex
    from agentgym.envs.webshop.world import CatalogSource

    t0 = time.perf_counter()
    catalog = generate_catalog(products)
    generated = time.perf_counter() - t0
    folder = cache_dir("webshop") / f"index-{CatalogSource(n_products=products).fingerprint()}"
    t0 = time.perf_counter()
    SearchIndex(catalog, folder)
    built = time.perf_counter() - t0
    t0 = time.perf_counter()
    index = SearchIndex(catalog, folder)
    reopened = time.perf_counter() - t0
    return index, {"generate_s": generated, "index_build_s": built, "index_open_ms": reopened * 1000}


def search_figures(index: Any, n_test: int) -> dict[str, float]:
    from agentgym.envs.webshop.goals import generate_goals

    goals = generate_goals(index.products, "test", n_test)
    queries = [g.instruction for g in goals] + [
        p.title for p in index.products[:: max(1, len(index.products) // 1000)]
    ]
    latencies = []
    for query in queries:
        t0 = time.perf_counter()
        index.search(query, 50)
        latencies.append(time.perf_counter() - t0)
    return {
        "queries": len(queries),
        "p50_ms": percentile_ms(latencies, 50),
        "p99_ms": percentile_ms(latencies, 99),
    }


async def concurrent_sessions(url: str, sessions: int, seconds: float) -> dict[str, float]:
    """``sessions`` workers, each playing expert episodes back to back until time is up."""
    latencies: list[float] = []
    episodes = successes = 0

    async def worker(client: AsyncEnvClient, task_ids: list[str], deadline: float) -> None:
        nonlocal episodes, successes
        for i in range(10**9):
            if time.perf_counter() >= deadline:
                return
            created = await client.create(task_ids[i % len(task_ids)])
            info = created.info
            while "expert_action" in info:
                t0 = time.perf_counter()
                info = (await client.step(created.session_id, info["expert_action"])).info
                latencies.append(time.perf_counter() - t0)
            await client.delete(created.session_id)
            episodes, successes = episodes + 1, successes + bool(info["success"])

    async with AsyncEnvClient(url, max_connections=sessions) as client:
        task_ids = [t.task_id for t in (await client.tasks(split="test", limit=10_000)).tasks]
        start = time.perf_counter()
        shards = [task_ids[i::sessions] or task_ids for i in range(sessions)]
        await asyncio.gather(*(worker(client, shard, start + seconds) for shard in shards))
        elapsed = time.perf_counter() - start
    return {
        "sessions": sessions,
        "steps_per_s": len(latencies) / elapsed,
        "episodes_per_s": episodes / elapsed,
        "step_p50_ms": percentile_ms(latencies, 50),
        "step_p99_ms": percentile_ms(latencies, 99),
        "success_rate": successes / max(episodes, 1),
    }


def browser_figures(url: str, products: int, n_test: int, tasks: int) -> dict[str, float]:
    from agentgym.envs.webshop import WebShopEnv

    env = WebShopEnv(n_products=products, n_test=n_test, mode="browser", site_url=url)
    successes = steps = 0
    start = time.perf_counter()
    for task in env.tasks("test")[:tasks]:
        env.reset(task_id=task.task_id)
        while not env.done:
            *_, info = env.step(env.expert_action())
            steps += 1
        successes += bool(info["success"])
    elapsed = time.perf_counter() - start
    env.close()
    return {"tasks": tasks, "success_rate": successes / tasks, "s_per_step": elapsed / max(steps, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--products", type=int, default=50_000)
    parser.add_argument("--test-tasks", type=int, default=200)
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--browser-tasks", type=int, default=20)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    # A fresh cache, so the index build is measured; the server reuses the index built here.
    os.environ["AGENTGYM_CACHE"] = os.environ.get("AGENTGYM_BENCH_CACHE") or tempfile.mkdtemp(
        prefix="ws-bench-"
    )

    index, build = build_figures(args.products, args.test_tasks)
    print(f"catalog of {args.products} products: {build}", flush=True)
    search = search_figures(index, args.test_tasks)
    print(f"search: {search}", flush=True)
    settings = ["--set", f"n_products={args.products}", "--set", f"n_test={args.test_tasks}"]
    server = start_server_process("webshop", extra_args=[*settings, "--log-level", "warning"])
    try:
        wait_healthy(server.url, 300, server.process)
        http = asyncio.run(concurrent_sessions(server.url, args.sessions, args.seconds))
        print(f"http: {http}", flush=True)
        browser = browser_figures(server.url, args.products, args.test_tasks, args.browser_tasks)
        print(f"browser mode: {browser}", flush=True)
    finally:
        server.stop()
    if args.json:
        figures = {"build": build, "search": search, "http": http, "browser": browser}
        Path(args.json).write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
