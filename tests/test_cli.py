"""The `agentgym` command line, run as a user would (real subprocesses for `up`/`serve`)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import psutil
from typer.testing import CliRunner

from agentgym import hosting
from agentgym.cli import app
from agentgym.servers.launcher import ENV_PORT_OFFSETS, free_port, start_server_process, wait_healthy
from conftest import read_until, stop_with_ctrl_c

runner = CliRunner()


def test_unknown_env_is_a_usage_error() -> None:
    for args in (["serve", "no-such-env"], ["up", "no-such-env"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2
        assert "unknown environment 'no-such-env'" in result.output
        assert "textworld" in result.output  # the message lists what is registered


def test_bad_setting_is_a_usage_error() -> None:
    assert runner.invoke(app, ["serve", "textworld", "--set", "nonsense"]).exit_code == 2
    result = runner.invoke(app, ["serve", "textworld", "--set", "no_such_knob=1"])
    assert result.exit_code == 2 and "no_such_knob" in result.output


def test_envs_lists_registered_and_running() -> None:
    result = runner.invoke(app, ["envs"])
    assert result.exit_code == 0 and "textworld" in result.output


def test_serve_process_answers_and_stops_on_sigint() -> None:
    server = start_server_process("textworld", extra_args=["--log-level", "warning"])
    try:
        wait_healthy(server.url, 120, server.process)
        assert httpx.get(f"{server.url}/health").json()["env"] == "textworld"
    finally:
        assert server.stop() == 0


def test_serve_takes_its_session_cap_from_the_env_hosting_declaration() -> None:
    """sciworld's folder declares a low cap (a JVM per session): `serve` starts with it
    unless told otherwise, as the generated compose file does."""
    declared = hosting.of("sciworld").max_sessions
    assert declared != hosting.DEFAULT_MAX_SESSIONS
    server = start_server_process("sciworld", extra_args=["--warm", "0", "--log-level", "warning"])
    try:
        wait_healthy(server.url, 120, server.process)
        assert httpx.get(f"{server.url}/health").json()["capacity"] == declared
    finally:
        assert server.stop() == 0


def test_up_starts_servers_prints_urls_and_stops_them_on_ctrl_c(tmp_path) -> None:
    base = free_port() - ENV_PORT_OFFSETS["textworld"]  # never the user's 8101
    up = ["up", "textworld", "--base-port", str(base), "--warm", "3", "--log-dir", str(tmp_path)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", *up],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    try:
        output = read_until(proc, "Ctrl-C", 180)
        urls = re.findall(r"http://127\.0\.0\.1:\d+", output)
        assert urls, output
        assert httpx.get(f"{urls[0]}/health").json()["env"] == "textworld"
        children = psutil.Process(proc.pid).children(recursive=True)
        (server,) = [child for child in children if "serve" in child.cmdline()]
        command = server.cmdline()
        assert command[command.index("--warm") + 1] == "3"  # up's --warm reaches every server
        stop_with_ctrl_c(proc, children, output)
    finally:
        if proc.poll() is None:
            proc.kill()
