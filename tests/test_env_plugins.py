"""Third-party environments through the ``agentgym.envs`` entry point (issue 20, item 5).

``tests/data/example_env_pkg`` is an installed package in miniature: a module and the
``.dist-info`` folder (``METADATA``, ``entry_points.txt``) that ``pip install`` writes. On a
real ``agentgym`` process's ``PYTHONPATH``, ``importlib.metadata`` finds its entry point as
it finds an installed one's; nothing is installed into the venv.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from agentgym.servers.launcher import free_port, start_server_process, wait_healthy

EXAMPLE_PACKAGE = Path(__file__).parent / "data" / "example_env_pkg"


def python_path(*folders: Path) -> str:
    return os.pathsep.join([*map(str, folders), *filter(None, [os.environ.get("PYTHONPATH")])])


def agentgym(args: list[str], path: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args],
        env=os.environ | {"PYTHONPATH": path, "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_serve_finds_a_plugin_env_and_plays_it_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", python_path(EXAMPLE_PACKAGE))
    server = start_server_process("echo", extra_args=["--log-level", "warning"])
    try:
        wait_healthy(server.url, 120, server.process)
        with httpx.Client(base_url=server.url, timeout=30) as http:
            assert http.get("/metadata").json()["name"] == "echo"
            created = http.post("/sessions", json={"task_id": "echo/3"}).json()
            assert created["observation"] == "Say: cloud"
            step = http.post(
                f"/sessions/{created['session_id']}/step", json={"action": created["info"]["expert_action"]}
            ).json()
            assert step["terminated"] and step["reward"] == 1.0 and step["info"]["success"]
            compat_id = http.post("/create").json()["id"]  # the generic AgentGym dialect works too
            assert (
                http.post("/reset", json={"id": compat_id, "data_idx": 1}).json()["observation"]
                == "Say: river"
            )
            assert http.post("/step", json={"id": compat_id, "action": "river"}).json()["reward"] == 1.0
    finally:
        server.stop()


def test_plugins_are_listed_never_shadow_a_builtin_and_fail_clearly(tmp_path: Path) -> None:
    rogue = tmp_path / "agentgym_rogue-1.0.dist-info"
    rogue.mkdir()
    (rogue / "METADATA").write_text("Metadata-Version: 2.1\nName: agentgym-rogue\nVersion: 1.0\n")
    (rogue / "entry_points.txt").write_text(
        "[agentgym.envs]\ntextworld = agentgym_rogue:Fake\nbroken = agentgym_rogue_missing:Env\n"
    )
    path = python_path(EXAMPLE_PACKAGE, tmp_path)

    listed = agentgym(["envs"], path)
    assert listed.returncode == 0, listed.stderr
    names = re.findall(r"^\W*(\w[\w-]*)\s", listed.stdout, re.MULTILINE)
    assert {"echo", "broken", "textworld"} <= set(names) and names.count("textworld") == 1
    assert "textworld = agentgym_rogue:Fake ignored" in listed.stderr

    served = agentgym(["serve", "broken", "--port", str(free_port())], path)
    assert served.returncode == 2
    assert "'broken' (agentgym_rogue_missing:Env) cannot be loaded" in served.stdout + served.stderr
