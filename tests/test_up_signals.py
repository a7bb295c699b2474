"""Issue 40: `agentgym up` stops every child on SIGINT and on SIGTERM however it was started,
and `--replica-ports` puts the replicas on ports the user chose. `up` runs as a real process;
its ports are found free at runtime."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
from pathlib import Path

import httpx
import psutil
import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.servers.launcher import PortInUse, bind_listener, free_port
from conftest import read_until, start_up


def stop_with(proc: subprocess.Popen, signum: int, output: str) -> None:
    """``signum`` to a running `up`: it must exit 0, say so, and leave no child behind."""
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) == 3, output  # two replicas and the gateway
    proc.send_signal(signum)
    try:
        rest = proc.communicate(timeout=30)[0]
    except subprocess.TimeoutExpired:
        rest = "(still running 30 s after the signal)"
    assert proc.returncode == 0, output + rest
    assert "all servers stopped" in rest, rest
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, alive


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_up_started_in_the_background_stops_every_child_on_a_signal(signum: int, tmp_path: Path) -> None:
    """Started in the background, `up` ignored SIGINT; SIGTERM ended it at once, without
    stopping anything (its children died of their parent-death signal, unordered)."""
    port = free_port()
    proc = start_up(["choice=2", "--gateway-port", str(port), "--log-dir", str(tmp_path)], background=True)
    try:
        output = read_until(proc, "Ctrl-C", timeout=90)
        assert httpx.get(f"http://127.0.0.1:{port}/envs/choice/health", timeout=10).json()["healthy"] == 2
        stop_with(proc, signum, output)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def free_range(count: int) -> tuple[int, int]:
    """``count`` consecutive ports free right now, below the ephemeral range."""
    for _ in range(100):
        first = random.randrange(20000, 32000)
        with contextlib.suppress(PortInUse), contextlib.ExitStack() as held:
            for port in range(first, first + count):
                held.enter_context(contextlib.closing(bind_listener("127.0.0.1", port)))
            return first, first + count - 1
    raise AssertionError("no free port range")


def test_replica_ports_choose_where_the_replicas_listen(tmp_path: Path) -> None:
    """`up` put replicas on random ports only."""
    runner = CliRunner()
    for bad in ("9100", "9200-9100", "x", "9100-", "70000"):  # one port for two servers; not ports
        result = runner.invoke(app, ["up", "choice=2", "--replica-ports", bad, "--log-dir", str(tmp_path)])
        assert result.exit_code == 2, (bad, result.output)
    first, last = free_range(4)
    port = free_port()
    args = ["choice=2", "--replica-ports", f"{first}-{last}", "--gateway-port", str(port)]
    proc = start_up([*args, "--log-dir", str(tmp_path)])
    try:
        output = read_until(proc, "Ctrl-C", timeout=90)
        children = psutil.Process(proc.pid).children()
        replicas = [c.cmdline() for c in children if "serve" in c.cmdline()]
        ports = sorted(int(command[command.index("--port") + 1]) for command in replicas)
        assert len(ports) == 2 and all(first <= p <= last for p in ports), output
        for replica in ports:
            assert httpx.get(f"http://127.0.0.1:{replica}/health", timeout=10).json()["env"] == "choice"
        stop_with(proc, signal.SIGTERM, output)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
