"""Issue 19 item 6, the viewer: a malformed record cannot break it for ever, and it answers
only Host headers that name this machine (no DNS rebinding)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from agentgym.servers.launcher import free_port
from agentgym.viewer import create_app
from conftest import read_until


def record(task_id: str, **fields: object) -> str:
    base = {"env": "choice", "task_id": task_id, "messages": [{"role": "user", "content": "hi"}], "turns": 1}
    return json.dumps(base | fields) + "\n"


def test_a_record_with_a_malformed_field_is_skipped_not_a_500_for_ever(tmp_path: Path) -> None:
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text(record("ok-1"))
    with TestClient(create_app(trajectories), raise_server_exceptions=False) as client:
        with trajectories.open("a") as appended:  # a live run appends while the viewer watches
            appended.write(record("bad", sample="x") + record("bad-2", score=[1]) + record("ok-2"))
        for _ in range(2):  # and again (after the 1 s refresh): bad lines are not re-read and re-failed
            time.sleep(1.1)
            info = client.get("/api/info")
            assert info.status_code == 200, info.text
        assert info.json()["skipped_lines"] == 2
        assert info.json()["episodes"] == 2


def wait_listening(http: httpx.Client, url: str, proc: subprocess.Popen, output: str) -> None:
    """The CLI prints its URL before uvicorn listens: poll until it answers (10 s at most)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            http.get(url)
            return
        except httpx.TransportError:
            assert time.monotonic() < deadline and proc.poll() is None, output
            time.sleep(0.2)


def test_the_viewer_answers_only_its_own_host_names(tmp_path: Path) -> None:
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text(record("ok-1"))
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "view",
        str(trajectories),
        "--port",
        str(port),
        "--no-open",
    ]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output = read_until(proc, "Ctrl-C", timeout=60)
        url = f"http://127.0.0.1:{port}/api/info"
        with httpx.Client(timeout=10) as http:
            wait_listening(http, url, proc, output)
            for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost"):
                assert http.get(url, headers={"host": host}).status_code == 200, host
            for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
                assert http.get(url, headers={"host": host}).status_code == 400, host
    finally:
        proc.terminate()
        proc.wait(timeout=30)
