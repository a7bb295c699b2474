"""Our ScienceWorld server side by side with AgentGym's own, under the same load and games.

    python bench/sciworld_peer.py --peer PATH [--loads 1x1x80 4x1x80 16x1x80 16x3x20]
                                  [--warm 16] [--set gold_path=false] [--json out.json]

``PATH`` is a local copy of AgentGym's ScienceWorld server: the ``agentenv-sciworld``
folder of https://github.com/WooooDyy/AgentGym (or the repository's root). Getting it is
the user's step (``git clone https://github.com/WooooDyy/AgentGym``); nothing of it is
vendored here. It needs ``fastapi``, ``uvicorn`` and ``scienceworld``, which this
project's environment already has, so it runs on this interpreter with ``PATH`` on its
``PYTHONPATH`` (``uvicorn agentenv_sciworld:app``). Its JVMs get the same heap cap as
ours (``-Xmx512m`` through ``JAVA_TOOL_OPTIONS``; ``--peer-heap-mb 0`` leaves its default).

Both servers start fresh, each with its own empty ``TMPDIR``, and are driven the same way
through AgentGym's routes, which ours serves too: a load ``SxExN`` is S concurrent
clients, each playing E episodes of create -> reset (AgentGym's ``data_idx``, the same
games for both) -> N steps -> close, the steps alternating ``look around`` and
``inventory`` (real engine steps that never end an episode). One thread and plain
``httpx.Client`` per client, as AgentGym's requests-based client does. Per load and
server: steps/s over the wall time (creates, resets and closes included), step p50,
create+reset p50 / p99 / max, close p50, and the load generator's CPU. Per server over
the whole run: RSS of the server and its children (JVMs, workers) before the first load,
peak, and after the last; open file descriptors and ``TMPDIR`` entries before and after
(what each leaked). Loads alternate between the servers: AgentGym's runs first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).parent))  # run as a script: share bench/server.py's helpers
from server import percentile as _percentile

from agentgym.servers.launcher import start_server_process, wait_healthy

ACTIONS = ("look around", "inventory")
GAMES = 3000
"""AgentGym's ``data_idx`` range the episodes draw from (its list has ~4,900 games)."""


@dataclass
class Load:
    sessions: int
    episodes: int
    steps: int

    @classmethod
    def parse(cls, text: str) -> Load:
        sessions, episodes, steps = (int(part) for part in text.lower().split("x"))
        return cls(sessions, episodes, steps)

    def __str__(self) -> str:
        return f"{self.sessions}x{self.episodes}x{self.steps}"


@dataclass
class Run:
    server: str
    load: str
    steps: int
    seconds: float
    step_p50_ms: float
    start_p50_s: float
    start_p99_s: float
    start_max_s: float
    close_p50_ms: float
    errors: int
    client_cpu_s: float

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.seconds


@dataclass
class Server:
    name: str
    url: str
    process: subprocess.Popen
    tmpdir: Path
    stop: object
    memory: dict = field(default_factory=dict)


def percentile(samples: list[float], q: int) -> float:
    """In ms; a single sample (one create at 1 x 1) is its own percentile."""
    return samples[0] * 1000 if len(samples) == 1 else _percentile(samples, q)


def play(url: str, load: Load, client: int) -> tuple[list[float], list[float], list[float], int]:
    """One client's episodes: step latencies, create+reset latencies, close latencies, errors."""
    steps, starts, closes, errors = [], [], [], 0
    with httpx.Client(base_url=url, timeout=900) as http:
        for episode in range(load.episodes):
            data_idx = (client * load.episodes + episode) * 101 % GAMES
            t0 = time.perf_counter()
            env_id = http.post("/create").json()["id"]
            reset = http.post("/reset", json={"id": env_id, "data_idx": data_idx}).json()
            starts.append(time.perf_counter() - t0)
            errors += "error" in reset
            for turn in range(load.steps):
                t0 = time.perf_counter()
                reply = http.post("/step", json={"id": env_id, "action": ACTIONS[turn % 2]}).json()
                steps.append(time.perf_counter() - t0)
                errors += "error" in reply
            t0 = time.perf_counter()
            http.post("/close", json={"id": env_id})
            closes.append(time.perf_counter() - t0)
    return steps, starts, closes, errors


def run_load(server: Server, load: Load) -> Run:
    me = psutil.Process()
    cpu0, start = sum(me.cpu_times()[:2]), time.perf_counter()
    with ThreadPoolExecutor(load.sessions) as threads:
        results = list(threads.map(lambda c: play(server.url, load, c), range(load.sessions)))
    seconds = time.perf_counter() - start
    steps, starts, closes = ([x for r in results for x in r[i]] for i in range(3))
    return Run(
        server=server.name,
        load=str(load),
        steps=len(steps),
        seconds=seconds,
        step_p50_ms=percentile(steps, 50),
        start_p50_s=percentile(starts, 50) / 1000,
        start_p99_s=percentile(starts, 99) / 1000,
        start_max_s=max(starts),
        close_p50_ms=percentile(closes, 50),
        errors=sum(r[3] for r in results),
        client_cpu_s=sum(me.cpu_times()[:2]) - cpu0,
    )


def tree(pid: int) -> list[psutil.Process]:
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def rss(pid: int) -> int:
    total = 0
    for process in tree(pid):
        with contextlib.suppress(psutil.Error):
            total += process.memory_info().rss
    return total


def fds(pid: int) -> int:
    total = 0
    for process in tree(pid):
        with contextlib.suppress(psutil.Error):
            total += process.num_fds()
    return total


@contextlib.contextmanager
def peak_sampler(servers: list[Server]) -> Iterator[dict[str, int]]:
    """Sample each server's RSS (with children) every 0.5 s while the block runs."""
    peaks = {s.name: 0 for s in servers}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            for server in servers:
                peaks[server.name] = max(peaks[server.name], rss(server.process.pid))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        done.set()
        thread.join()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_peer(path: Path, tmpdir: Path, heap_mb: int) -> Server:
    folder = path / "agentenv-sciworld" if (path / "agentenv-sciworld").is_dir() else path
    if not (folder / "agentenv_sciworld" / "server.py").is_file():
        sys.exit(f"{path} holds no agentenv_sciworld/server.py (AgentGym's agentenv-sciworld folder)")
    port = free_port()
    env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONPATH": str(folder)}
    if heap_mb:  # the same heap cap as our JVMs (its own launch passes no -Xmx)
        env["JAVA_TOOL_OPTIONS"] = f"-Xmx{heap_mb}m"
    command = [sys.executable, "-m", "uvicorn", "agentenv_sciworld:app", "--host", "127.0.0.1"]
    process = subprocess.Popen(
        [*command, "--port", str(port), "--log-level", "warning"],
        env=env,
        cwd=tmpdir,
        stdout=subprocess.DEVNULL,  # it prints a line per create and close
    )

    def stop() -> None:
        family = tree(process.pid)
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(30)
        for member in family:  # its JVMs, if it left any
            with contextlib.suppress(psutil.Error):
                member.kill()

    url = f"http://127.0.0.1:{port}"
    wait_until_up(url, process)
    return Server("AgentGym", url, process, tmpdir, stop)


def wait_until_up(url: str, process: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            sys.exit(f"the server at {url} exited with code {process.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url + "/", timeout=5).status_code == 200:
                return
        time.sleep(0.5)
    sys.exit(f"the server at {url} did not come up in {timeout:g} s")


def start_ours(warm: int, max_sessions: int, settings: list[str], tmpdir: Path) -> Server:
    old = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(tmpdir)
    try:
        args = ["--log-level", "warning", "--max-sessions", str(max_sessions), "--warm", str(warm)]
        args += [arg for setting in settings for arg in ("--set", setting)]
        server = start_server_process("sciworld", extra_args=args)
    finally:
        if old is None:
            os.environ.pop("TMPDIR")
        else:
            os.environ["TMPDIR"] = old
    wait_healthy(server.url, 600, server.process)
    return Server("ours", server.url, server.process, tmpdir, server.stop)


def snapshot(server: Server) -> dict[str, int]:
    return {
        "rss_mib": round(rss(server.process.pid) / 2**20),
        "fds": fds(server.process.pid),
        "tmp_entries": len(list(server.tmpdir.iterdir())),
    }


def print_table(runs: list[Run], loads: list[Load]) -> None:
    print(
        "\n| sessions x episodes x steps | AgentGym steps/s | ours steps/s | ratio "
        "| step p50 AgentGym / ours | create+reset p50 / p99 (max) AgentGym | ours | close p50 AgentGym / ours |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for load in loads:
        peer, ours = (
            next(r for r in runs if r.server == name and r.load == str(load)) for name in ("AgentGym", "ours")
        )
        print(
            f"| {load.sessions} x {load.episodes} x {load.steps} | {peer.steps_per_s:.1f} | {ours.steps_per_s:.1f} "
            f"| {ours.steps_per_s / peer.steps_per_s:.1f}x | {peer.step_p50_ms:.1f} / {ours.step_p50_ms:.1f} ms "
            f"| {peer.start_p50_s:.2f} / {peer.start_p99_s:.2f} s ({peer.start_max_s:.1f} s) "
            f"| {ours.start_p50_s:.2f} / {ours.start_p99_s:.2f} s ({ours.start_max_s:.1f} s) "
            f"| {peer.close_p50_ms:.0f} / {ours.close_p50_ms:.0f} ms |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--peer", type=Path, required=True, help="AgentGym's agentenv-sciworld folder (or repo root)"
    )
    parser.add_argument("--loads", nargs="+", default=["1x1x80", "4x1x80", "16x1x80", "16x3x20"])
    parser.add_argument("--warm", type=int, default=16, help="our server's --warm")
    parser.add_argument("--max-sessions", type=int, default=64, help="our server's --max-sessions")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="our server's --set (repeatable); gold_path=false does AgentGym's work: no expert path per load",
    )
    parser.add_argument(
        "--peer-heap-mb",
        type=int,
        default=512,
        help="-Xmx of AgentGym's JVMs (0: the JVM's default, 1/4 of RAM)",
    )
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()
    loads = [Load.parse(text) for text in args.loads]

    with tempfile.TemporaryDirectory() as root:
        peer_tmp, ours_tmp = Path(root, "peer"), Path(root, "ours")
        peer_tmp.mkdir(), ours_tmp.mkdir()
        servers = [
            start_peer(args.peer, peer_tmp, args.peer_heap_mb),
            start_ours(args.warm, args.max_sessions, args.settings, ours_tmp),
        ]
        runs: list[Run] = []
        try:
            for server in servers:
                server.memory["before"] = snapshot(server)
            with peak_sampler(servers) as peaks:
                for load in loads:
                    for server in servers:
                        runs.append(run_load(server, load))
                        r = runs[-1]
                        print(
                            f"{r.server:>8} {r.load:>8}: {r.steps_per_s:6.1f} steps/s, step p50 {r.step_p50_ms:7.1f} ms, "
                            f"create+reset p50 {r.start_p50_s:5.2f} s p99 {r.start_p99_s:5.2f} s max {r.start_max_s:5.1f} s, "
                            f"close p50 {r.close_p50_ms:5.0f} ms, {r.errors} errors, load generator CPU {r.client_cpu_s:.1f} s "
                            f"in {r.seconds:.1f} s",
                            flush=True,
                        )
            time.sleep(5)  # let closes finish
            for server in servers:
                server.memory["peak_rss_mib"] = round(peaks[server.name] / 2**20)
                server.memory["after"] = snapshot(server)
                print(f"{server.name:>8} memory and leaks: {server.memory}", flush=True)
        finally:
            for server in servers:
                server.stop()
    print_table(runs, loads)
    if args.json:
        memory = {s.name: s.memory for s in servers}
        Path(args.json).write_text(
            json.dumps({"runs": [asdict(r) for r in runs], "memory": memory}, indent=2)
        )


if __name__ == "__main__":
    main()
