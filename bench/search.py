"""Search env figures on a ~100k-passage corpus: corpus generation and BM25 index build
time, query latency (p50/p99 over the gold hop queries of generated questions), and
env step latency in-process and over HTTP (expert episodes against `agentgym serve`).
Then dense and hybrid retrieval (needs the search-dense extra): embedding build time
and query latency on a smaller corpus (embedding 100k passages takes most of an hour
on 2 CPU cores), plus dense query latency against 100k stand-in vectors.

    python bench/search.py [--scale 55] [--distractors 3] [--queries 2000] [--episodes 300]
                           [--dense-scale 1] [--dense-queries 300]

Scale 55 with 3 distractors per entity gives 100,760 passages; dense scale 1 with 3
gives 1,832. The index is built into a fresh cache folder (so the build is timed), then
the server process reuses it.
Figures go to bench/RESULTS.md by hand, with the machine they were measured on.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx
import numpy as np

from agentgym.envs.search import SearchEnv
from agentgym.envs.search.index import build_index
from agentgym.envs.search.kb import KnowledgeBase
from agentgym.servers.launcher import start_server_process, wait_healthy

T = TypeVar("T")
Search = Callable[[str, int], object]


def ms(samples: list[float], q: int) -> float:
    return statistics.quantiles(samples, n=100, method="inclusive")[q - 1] * 1000


def report(label: str, samples: list[float]) -> None:
    print(f"{label:<26} n={len(samples):<6} p50={ms(samples, 50):7.3f} ms  p99={ms(samples, 99):7.3f} ms")


def timed(label: str, fn: Callable[[], T]) -> T:
    start = time.perf_counter()
    result = fn()
    print(f"{label:<26} {time.perf_counter() - start:7.2f} s")
    return result


def query_latency(env: SearchEnv, count: int, search: Search | None = None) -> list[float]:
    """Latency of ``search`` (default the env's retriever) over the gold hop queries of train."""
    search = search or env.retriever.search
    queries = [q for task in env.tasks("train") for q in env.library.questions[task.task_id].hop_queries]
    samples = []
    for query in (queries * (count // max(len(queries), 1) + 1))[:count]:
        start = time.perf_counter()
        search(query, env.top_k)
        samples.append(time.perf_counter() - start)
    return samples


def in_process_steps(env: SearchEnv, episodes: int) -> list[float]:
    samples = []
    for task in env.tasks("test")[:episodes]:
        env.reset(task_id=task.task_id)
        while not env.done:
            action = env.expert_action()
            start = time.perf_counter()
            env.step(action)
            samples.append(time.perf_counter() - start)
    return samples


def http_steps(url: str, task_ids: list[str]) -> tuple[list[float], float]:
    samples, successes = [], 0
    with httpx.Client(timeout=60) as http:
        for task_id in task_ids:
            body = http.post(f"{url}/sessions", json={"task_id": task_id}).json()
            session, info = body["session_id"], body["info"]
            while "expert_action" in info:
                start = time.perf_counter()
                step = http.post(f"{url}/sessions/{session}/step", json={"action": info["expert_action"]})
                samples.append(time.perf_counter() - start)
                info = step.json()["info"]
            successes += info["success"]
            http.delete(f"{url}/sessions/{session}")
    return samples, successes / len(task_ids)


def dense_figures(scale: int, distractors: int, count: int) -> None:
    """Embedding build and dense/hybrid query latency on a small corpus, then dense
    latency at 100k passages with random unit vectors standing in for the embeddings
    (the matrix product costs the same whatever the vectors hold)."""
    from agentgym.envs.search.dense import DenseIndex, encoder

    timed("model load", encoder)
    config = {"kb_scale": scale, "distractors": distractors, "n_train": 1000, "n_test": 0}
    env = timed("embed corpus (dense)", lambda: SearchEnv(retriever="dense", **config))
    print(f"{'embedded passages':<26} {len(env.library.passages()):,}")
    report("query (top-3, dense)", query_latency(env, count))
    report("query (top-3, hybrid)", query_latency(env, count, env.library.retriever("hybrid").search))
    vectors = np.random.default_rng(0).standard_normal((100_000, 384), dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    stand_in = DenseIndex(encoder(), np.arange(len(vectors)).astype(str), vectors)
    # Ids and scores only: the stand-in's ids are not the corpus's, so no passage fetch.
    report("query (dense, 100k vecs)", query_latency(env, count, stand_in.search))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=int, default=55)
    parser.add_argument("--distractors", type=int, default=3)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--dense-scale", type=int, default=1)
    parser.add_argument("--dense-queries", type=int, default=300)
    args = parser.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="agentgym-search-bench-"))
    os.environ["AGENTGYM_CACHE"] = str(cache)  # the server process inherits it
    config = {
        "kb_scale": args.scale,
        "distractors": args.distractors,
        "n_train": 1000,
        "n_test": args.episodes,
    }

    kb = timed("generate corpus", lambda: KnowledgeBase(0, args.scale, args.distractors))
    print(f"{'passages':<26} {len(kb.passages):,}")
    probe = cache / "build-probe"
    timed("index build (BM25)", lambda: build_index(probe, kb.passages))
    print(f"{'index size':<26} {sum(f.stat().st_size for f in probe.rglob('*')) / 2**20:.1f} MiB")
    env = timed("env init (gen + build)", lambda: SearchEnv(**config))
    report("query (top-3, BM25)", query_latency(env, args.queries))
    report("env step in-process", in_process_steps(env, args.episodes))

    extra = [arg for key, value in config.items() for arg in ("--set", f"{key}={value}")]
    server = start_server_process("search", extra_args=[*extra, "--log-level", "warning"])
    try:
        timed("server start (cached)", lambda: wait_healthy(server.url, 300, server.process))
        task_ids = [t.task_id for t in env.tasks("test")]
        samples, success = http_steps(server.url, task_ids)
        report("env step over HTTP", samples)
        print(f"{'expert success (HTTP)':<26} {success:.0%} of {len(task_ids)} test episodes")
    finally:
        server.stop()
    dense_figures(args.dense_scale, args.distractors, args.dense_queries)


if __name__ == "__main__":
    main()
