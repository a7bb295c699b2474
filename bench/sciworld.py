"""ScienceWorld server vs the raw engine: steps/s and p50/p99 step latency at 1, 4 and 16
concurrent sessions over HTTP, the same at 1 session in-process (the raw engine step,
``PythonInterface.step``, which is what ``env.server.step`` calls; our lean
``SciWorldEnv.step``; ScienceWorld's own ``ScienceWorldEnv.step``), then the server's RSS,
JVMs included, across N whole episodes.

    python bench/sciworld.py [--seconds 20] [--sessions 4 16] [--episodes 500] [--memory-only] [--json out.json]

The workload is the real one: each session plays the test split's tasks in order
(staggered per session), replaying the engine's gold path, first untimed for
``--warmup`` s (JVM start, JIT), then for ``--seconds``. Only the step calls are timed
(loads are not); steps/s is timed steps over the measuring time, loads included. At one
session the raw engine, the lean env and an HTTP session are measured in alternating
rounds on the same JVM (see ``paired_single_session``); 4 and 16 sessions go to a
separate ``agentgym serve sciworld`` process, as in production. The RSS check plays
whole expert episodes (create, play, delete) of short tasks, 4 at a time, and samples
the server and its child JVMs. Figures go to bench/RESULTS.md by hand, with the machine
they were measured on.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))  # to share bench/server.py's figures (run as a script)
from server import ENDLESS, Figures, figures

from agentgym.envs.sciworld import SciWorldEnv
from agentgym.envs.sciworld.jvm import rss_with_children
from agentgym.envs.sciworld.tasks import TASK_TYPES, build_split
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread, start_server_process, wait_healthy

TASKS = [t.task_id for t in build_split("test", TASK_TYPES)]
SHORT_TYPES = (
    "find-living-thing",
    "find-non-living-thing",
    "find-plant",
    "find-animal",
    "lifespan-longest-lived",
)
RSS_TASKS = [t for t in TASKS if t.split("/")[0] in SHORT_TYPES]
SERVER_POOL = ["max_jvms=24", "spare_jvms=2", "max_idle_jvms=16"]
"""Warm JVMs stay idle between configurations, as in a long-running server."""


def in_process(mode: str, seconds: float, warmup: float) -> Figures:
    """One session in this process: tasks in order, each replaying its gold path, untimed
    for ``warmup`` s (JIT), then timed for ``seconds``; ``mode`` picks what a step is
    (raw engine, lean env, ScienceWorld's env)."""
    with SciWorldEnv() as env:
        env.reset(task_id=TASKS[0])  # borrows a JVM; "raw engine" drives it directly
        episode = _episode_runners(env)[mode]
        keep_playing(episode, warmup)
        start = time.perf_counter()
        latencies = keep_playing(episode, seconds)
        return figures(mode, 1, latencies, time.perf_counter() - start)


def keep_playing(episode: Callable[[str], list[float]], seconds: float) -> list[float]:
    """Play episodes of the test tasks in order until ``seconds`` passed; their step latencies."""
    latencies: list[float] = []
    tasks = itertools.cycle(TASKS)
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        latencies += episode(next(tasks))
    return latencies


def timed(step: Callable[[str], object], action: str) -> float:
    t0 = time.perf_counter()
    step(action)
    return time.perf_counter() - t0


def _episode_runners(env: SciWorldEnv) -> dict[str, Callable[[str], list[float]]]:
    """Per mode, ``episode(task_id) -> step latencies`` of one gold-path replay."""
    engine = env._jvm.engine

    def raw(task_id: str) -> list[float]:
        name, variation = task_id.rsplit("/", 1)
        engine.load(name, int(variation), "", True)
        engine.step("look around")
        return [timed(engine.step, action) for action in engine.getGoldActionSequence()]

    def lean(task_id: str) -> list[float]:
        _, info = env.reset(task_id=task_id, options=ENDLESS)
        latencies = []
        while "expert_action" in info:
            t0 = time.perf_counter()
            info = env.step(info["expert_action"])[4]
            latencies.append(time.perf_counter() - t0)
        return latencies

    wrapper = None

    def scienceworld(task_id: str) -> list[float]:
        nonlocal wrapper
        if wrapper is None:  # its own JVM, started on first use
            from scienceworld import ScienceWorldEnv

            wrapper = ScienceWorldEnv()
        name, variation = task_id.rsplit("/", 1)
        wrapper.load(name, int(variation), "", generateGoldPath=True)
        wrapper.step("look around")
        return [timed(wrapper.step, action) for action in wrapper.get_gold_action_sequence()]

    return {"raw engine": raw, "lean env": lean, "scienceworld env": scienceworld}


def expert_episode(client: httpx.Client, task_id: str, latencies: list[float]) -> dict:
    """Create a session, follow info.expert_action to the end (step latencies appended to
    ``latencies``), delete it; the last info."""
    created = client.post("/sessions", json={"task_id": task_id, "options": ENDLESS}).json()
    session, info = f"/sessions/{created['session_id']}", created["info"]
    while "expert_action" in info:
        t0 = time.perf_counter()
        reply = client.post(f"{session}/step", json={"action": info["expert_action"]})
        latencies.append(time.perf_counter() - t0)
        info = reply.json()["info"]
    client.delete(session)
    return info


def over_http(url: str, sessions: int, seconds: float) -> tuple[list[float], float]:
    """``sessions`` concurrent sessions for ``seconds``, each playing expert episodes of the
    test tasks in order (staggered); the step latencies and the elapsed time. One thread
    and plain ``httpx.Client`` per session, as AgentGym's requests-based clients do, so
    the figures hold the server's cost, not a client library's parsing."""
    start = time.perf_counter()

    def play(offset: int) -> list[float]:
        latencies: list[float] = []
        tasks = itertools.cycle(TASKS[offset:] + TASKS[:offset])
        with httpx.Client(base_url=url, timeout=600) as client:
            while time.perf_counter() - start < seconds:
                expert_episode(client, next(tasks), latencies)
        return latencies

    with ThreadPoolExecutor(sessions) as threads:
        runs = list(threads.map(play, [7 * i for i in range(sessions)]))
    return [latency for run in runs for latency in run], time.perf_counter() - start


def paired_single_session(seconds: float, warmup: float, rounds: int) -> list[Figures]:
    """The raw engine step, our lean env step and one HTTP session, alternating in
    ``rounds`` short rounds over the same tasks **on the same JVM**: the server runs in this
    process on the same pool, and each round borrows the pool's warmest JVM. ScienceWorld's
    steps keep getting faster for minutes as the JIT compiles them, so comparing JVMs of
    different age measures the JIT, not the server; alternating also spreads a busy
    machine's load over all three. Client and server share this process's GIL here, which
    only adds to the HTTP figure."""
    runs: dict[str, tuple[list[float], list[float]]] = {}

    def in_process_round(mode: str) -> Callable[[float], list[float]]:
        def play(duration: float) -> list[float]:
            with SciWorldEnv() as env:
                env.reset(task_id=TASKS[0])  # takes the warmest JVM
                return keep_playing(_episode_runners(env)[mode], duration)

        return play

    with serve_in_thread(ServerConfig(env="sciworld")) as url:
        players = {
            "raw engine": in_process_round("raw engine"),
            "lean env": in_process_round("lean env"),
            "http": lambda duration: over_http(url, 1, duration)[0],
        }
        players["raw engine"](warmup)
        for _ in range(rounds):
            for mode, play in players.items():
                start = time.perf_counter()
                latencies, elapsed = runs.setdefault(mode, ([], [0.0]))
                latencies += play(seconds / rounds)
                elapsed[0] += time.perf_counter() - start
    return [figures(mode, 1, latencies, elapsed[0]) for mode, (latencies, elapsed) in runs.items()]


def episodes_rss(url: str, pid: int, episodes: int, concurrency: int = 4) -> dict:
    """Play ``episodes`` short expert episodes; RSS (server + JVMs) before, peak and after."""
    baseline, start = rss_with_children(pid), time.perf_counter()

    def play(indices: range) -> tuple[int, int]:
        peak, successes = 0, 0
        with httpx.Client(base_url=url, timeout=600) as client:
            for i in indices:
                successes += bool(expert_episode(client, RSS_TASKS[i % len(RSS_TASKS)], [])["success"])
                peak = max(peak, rss_with_children(pid))
        return peak, successes

    with ThreadPoolExecutor(concurrency) as threads:
        results = list(threads.map(play, [range(i, episodes, concurrency) for i in range(concurrency)]))
    mib = 2**20
    return {
        "episodes": episodes,
        "successes": sum(ok for _, ok in results),
        "seconds": round(time.perf_counter() - start, 1),
        "rss_before_mib": round(baseline / mib),
        "rss_peak_mib": round(max(peak for peak, _ in results) / mib),
        "rss_after_mib": round(rss_with_children(pid) / mib),
    }


def report(row: Figures, raw: Figures) -> None:
    print(
        f"{row.mode:>16} {row.sessions:>3} sessions: {row.steps_per_s:7.1f} steps/s  p50 {row.p50_ms:6.2f} ms"
        f"  p99 {row.p99_ms:7.2f} ms  ({row.steps} steps; p50 {row.p50_ms / raw.p50_ms:4.2f}x raw)",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measuring time per configuration")
    parser.add_argument("--warmup", type=float, default=10.0, help="untimed play before each configuration")
    parser.add_argument(
        "--sessions", type=int, nargs="+", default=[4, 16], help="concurrent HTTP sessions (1 always runs)"
    )
    parser.add_argument("--rounds", type=int, default=4, help="alternating raw/HTTP rounds at 1 session")
    parser.add_argument("--episodes", type=int, default=500, help="episodes for the RSS check (0 skips)")
    parser.add_argument(
        "--memory-only", action="store_true", help="only the RSS check (skip the step figures)"
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    rows: list[Figures] = []
    http_sessions = [] if args.memory_only else [n for n in args.sessions if n > 1]
    if not args.memory_only:
        rows = paired_single_session(args.seconds, args.warmup, args.rounds)
        rows.append(in_process("scienceworld env", args.seconds, args.warmup))
        for row in rows:
            report(row, rows[0])
    sets = [arg for setting in SERVER_POOL for arg in ("--set", setting)]
    server = start_server_process("sciworld", extra_args=["--log-level", "warning", *sets])
    memory = None
    try:
        wait_healthy(server.url, 300, server.process)
        for sessions in http_sessions:
            over_http(server.url, sessions, args.warmup)  # start and warm the JVMs
            rows.append(figures("http", sessions, *over_http(server.url, sessions, args.seconds)))
            report(rows[-1], rows[0])
        if args.episodes:
            memory = episodes_rss(server.url, server.process.pid, args.episodes)
            print(f"RSS, server + JVMs, over {args.episodes} episodes: {memory}", flush=True)
    finally:
        server.stop()
    if args.json:
        Path(args.json).write_text(
            json.dumps({"rows": [asdict(r) for r in rows], "memory": memory}, indent=2)
        )


if __name__ == "__main__":
    main()
