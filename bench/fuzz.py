"""Schemathesis against every env server and the gateway (issue 19): how many requests it
tried and which, if any, got a server error.

    python bench/fuzz.py [--envs choice math textworld ...] [--examples 50] [--json out.json]

Before schemathesis (which fills the session slots), a probe pass throws what a schema-driven fuzzer does not (issue 40):
options nested 17 to 5,000 deep on create and on a live session's reset, abusive headers
(non-ASCII values, 120 fields, a 17 KiB value), the interpreter's meta-verbs as actions,
and 2,000 AgentGym-compat ids around a live one. It counts requests and 5xx, and checks
that a bystander session is untouched and no file appeared where the servers run.

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
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from agentgym import registry
from agentgym.envs.textworld.env import META_VERBS
from agentgym.servers.launcher import ServerProcess, start_gateway_process, start_server_process, wait_healthy

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
        completed = subprocess.run(command, capture_output=True, text=True, cwd=folder)  # its cache too
        figures.exit_code = completed.returncode
        _count(report, figures)
    figures.seconds = round(time.monotonic() - start, 1)
    return figures


def probe(target: str, url: str) -> Figures:
    """The abuse pass against the env API at ``url`` (an env server, or the gateway's
    ``/envs/ENV``): every answer counted, a 5xx kept; a bystander must end untouched."""
    figures, start = Figures(f"{target} probes"), time.monotonic()
    with httpx.Client(base_url=url, timeout=30) as http:
        bystander = http.post("/sessions", json={}, timeout=300).json()
        live = http.post("/sessions", json={}).json()["session_id"]
        legacy = http.post("/create", json={}).json()
        # Each AgentGym dialect answers /create its own way: an int, {"id": n}, {"env_idx": n}, ...
        legacy_id = (
            next(v for v in legacy.values() if isinstance(v, int)) if isinstance(legacy, dict) else legacy
        )

        def send(method: str, path: str, **kwargs: object) -> None:
            with contextlib.suppress(httpx.TransportError):  # a refused head may close first
                answer = http.request(method, path, **kwargs)
                figures.requests += 1
                if answer.status_code >= 500 and len(figures.server_errors) < 20:
                    figures.server_errors.append(
                        f"{method} {path} -> {answer.status_code} {answer.text[:200]}"
                    )

        for depth in (17, 100, 1000, 5000):
            for opening, closing in (('{"k": ', "}"), ("[", "]")):
                body = '{"options": ' + opening * depth + "1" + closing * depth + "}"
                for path in ("/sessions", f"/sessions/{live}/reset", "/openenv/reset"):
                    send("POST", path, content=body, headers={"content-type": "application/json"})
        for headers in (
            {"x-name": "café".encode("latin-1")},
            {f"x-{i}": "v" for i in range(120)},
            {"x-big": "a" * 17 * 1024},
        ):
            send("GET", f"/sessions/{live}", headers=headers)
        for verb in META_VERBS:
            send("POST", f"/sessions/{live}/step", json={"action": f"look. {verb}"})
        for offset in range(-1000, 1000):
            if offset:
                send("GET", "/observation", params={"id": legacy_id + offset})
        state = http.get(f"/sessions/{bystander['session_id']}").json()
        if (state.get("turn"), state.get("observation")) != (0, bystander["observation"]):
            figures.server_errors.append(f"the bystander session changed: {state}")
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
    parser.add_argument("--envs", nargs="+", default=registry.builtin_names())
    parser.add_argument("--examples", type=int, default=50, help="Examples per API operation.")
    parser.add_argument("--json", help="Also write the figures here.")
    args = parser.parse_args()
    started_in = set(Path.cwd().iterdir())
    servers = start(args.envs)
    results = []
    try:
        gateway = start_gateway_process({s.env: [s.url] for s in servers})
        servers.append(gateway)
        wait_healthy(gateway.url, timeout=60, process=gateway.process)
        members = servers[:-1]
        # Probes first: schemathesis fills the session slots a probe needs.
        results += [probe(s.env, s.url) for s in members]
        results += [probe(f"gateway/{s.env}", f"{gateway.url}/envs/{s.env}") for s in members]
        results += [fuzz(s.env, s.url, args.examples) for s in members]
        # The gateway's own spec has /envs/{env}/... routes: fuzz them as they are.
        results.append(fuzz("gateway", gateway.url, args.examples))
        for figures in results:
            print(_line(figures), flush=True)
        dead = [s.env for s in servers if s.process.poll() is not None]
        print(f"processes that died: {dead or 'none'}")
    finally:
        for server in reversed(servers):
            server.stop()
    written = set(Path.cwd().iterdir()) - started_in
    print(f"files written where the servers run: {sorted(map(str, written)) or 'none'}")
    total = sum(r.requests for r in results)
    errors = sum(len(r.server_errors) for r in results)
    print(f"total: {total} requests, {errors} server errors")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))


def _line(figures: Figures) -> str:
    errors = "".join(f"\n    {e}" for e in figures.server_errors)
    return (
        f"{figures.target:10s} {figures.requests:6d} requests  {len(figures.server_errors)} server errors"
        f"  (exit {figures.exit_code}, {figures.seconds} s){errors}"
    )


if __name__ == "__main__":
    main()
