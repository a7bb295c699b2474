"""Schemathesis against every env server and the gateway (issue 19): how many requests it
tried and which, if any, got a server error.

    python bench/fuzz.py [--envs choice math textworld ...] [--examples 50] [--json out.json]

Each server runs as its own process (`agentgym serve ENV`), as in production; the gateway
fronts one replica of each env. Schemathesis (`schemathesis run`, check
``not_a_server_error``, ``--max-examples`` per operation, all its phases: examples,
coverage, fuzzing, stateful) reads each one's ``/openapi.json``; requests and their
statuses are counted from its NDJSON report. A 503 ``engine_failed`` would be a documented
engine failure, but it is counted as a server error here too: on a healthy engine no
request should cause one. Not part of ``make test`` (minutes); figures go to
bench/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import base64
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from agentgym.servers.launcher import ServerProcess, start_gateway_process, start_server_process, wait_healthy

ENVS = ["choice", "math", "textworld", "search", "webshop", "sciworld"]
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@dataclass
class Figures:
    target: str
    requests: int = 0
    server_errors: list[str] = field(default_factory=list)
    """``METHOD URI -> status body`` of every 5xx answer (at most 20 kept)."""
    exit_code: int = 0
    seconds: float = 0.0


def fuzz(target: str, url: str, examples: int) -> Figures:
    """One schemathesis run against the server at ``url`` (its spec at ``url/openapi.json``)."""
    figures, start = Figures(target), time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "run.ndjson"
        command = [str(SCHEMATHESIS), "run", f"{url}/openapi.json", "--url", url]
        command += ["-c", "not_a_server_error", "-n", str(examples), "--request-timeout", "30"]
        command += ["--report", "ndjson", "--report-ndjson-path", str(report), "--no-color"]
        completed = subprocess.run(command, capture_output=True, text=True)
        figures.exit_code = completed.returncode
        _count(report, figures)
    figures.seconds = round(time.monotonic() - start, 1)
    return figures


def _count(report: Path, figures: Figures) -> None:
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        for interaction in (finished.get("recorder") or {}).get("interactions", {}).values():
            response = interaction.get("response") or {}
            figures.requests += 1
            if response.get("status_code", 0) >= 500 and len(figures.server_errors) < 20:
                request = interaction["request"]
                body = base64.b64decode((response.get("content") or {}).get("$base64", "")).decode(
                    errors="replace"
                )
                figures.server_errors.append(
                    f"{request['method']} {request['uri']} -> {response['status_code']} {body[:200]}"
                )


def start(envs: list[str]) -> list[ServerProcess]:
    servers = [start_server_process(env, extra_args=["--log-level", "warning"]) for env in envs]
    for server in servers:
        wait_healthy(server.url, timeout=300, process=server.process)
    return servers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", nargs="+", default=ENVS)
    parser.add_argument("--examples", type=int, default=50, help="Examples per API operation.")
    parser.add_argument("--json", help="Also write the figures here.")
    args = parser.parse_args()
    servers = start(args.envs)
    results = []
    try:
        gateway = start_gateway_process({s.env: [s.url] for s in servers})
        servers.append(gateway)
        wait_healthy(gateway.url, timeout=60, process=gateway.process)
        for server in servers[:-1]:
            results.append(fuzz(server.env, server.url, args.examples))
            print(_line(results[-1]), flush=True)
        # The gateway's own spec has /envs/{env}/... routes: fuzz them as they are.
        results.append(fuzz("gateway", gateway.url, args.examples))
        print(_line(results[-1]), flush=True)
        dead = [s.env for s in servers if s.process.poll() is not None]
        print(f"processes that died: {dead or 'none'}")
    finally:
        for server in reversed(servers):
            server.stop()
    total = sum(r.requests for r in results)
    errors = sum(len(r.server_errors) for r in results)
    print(f"total: {total} requests, {errors} server errors")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))


def _line(figures: Figures) -> str:
    errors = "".join(f"\n    {e}" for e in figures.server_errors)
    return (
        f"{figures.target:10s} {figures.requests:6d} requests  {len(figures.server_errors)} server errors"
        f"  (schemathesis exit {figures.exit_code}, {figures.seconds} s){errors}"
    )


if __name__ == "__main__":
    main()
