"""Progress that shows in a log: when the output is a pipe or a file, ``eval`` and ``train``
print plain progress lines while they run (rich's live bar prints nothing there until the
end), and a terminal still gets the live bar."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from agentgym.progress import LineProgress, progress
from conftest import TINY_RUN, read_until


def test_a_terminal_gets_the_live_bar_a_pipe_gets_lines() -> None:
    assert isinstance(progress(Console(file=io.StringIO(), force_terminal=True)), Progress)
    assert isinstance(progress(Console(file=io.StringIO(), force_terminal=False)), LineProgress)


def test_lines_say_done_of_total_status_elapsed_and_eta_and_beat_when_idle() -> None:
    out = io.StringIO()
    with LineProgress(Console(file=out, force_terminal=False, width=200), every=0, heartbeat=0.2) as bar:
        task = bar.add_task("training", total=4, completed=1)  # resumed at step 2
        bar.update(task, advance=1, description="rl  success 0.50")
        time.sleep(0.6)  # nothing moves: the heartbeat repeats the line
        bar.update(task, advance=2, description="rl  success 0.75")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("training 2/4 (50%) | rl success 0.50 | elapsed 0:00:00 | eta 0:00:00")
    assert len(lines) >= 3 and lines[1].startswith("training 2/4")  # a heartbeat
    assert lines[-1].startswith("training 4/4 (100%) | rl success 0.75")


def test_eval_prints_progress_lines_into_a_pipe_while_it_runs(textworld_url: str, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "agentgym.cli", "eval", "--env", "textworld", "--policy", "expert"]
    command += ["--n", "8", "--concurrency", "1", "--url", textworld_url, "--out", str(tmp_path)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        seen = read_until(process, "episodes 1/8", timeout=120)
        running = process.poll() is None  # the line came while eval still ran
        rest = process.stdout.read()
    assert running and "episodes 1/8 (12%) | success 1 errors 0 | elapsed" in seen, seen + rest
    assert "episodes 8/8 (100%)" in rest and process.returncode == 0


def test_train_prints_a_line_per_step_into_a_pipe(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    settings = [f"--set={k}={json.dumps(v)}" for k, v in (TINY_RUN | {"env_url": choice_url}).items()]
    command = [sys.executable, "-m", "agentgym.cli", "train", "--model", str(tiny_model_dir), *settings]
    command += ["--out", str(tmp_path / "run")]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as process:
        seen = read_until(process, "training 1/2 (50%)", timeout=300)
        running = process.poll() is None
        rest = process.stdout.read()
    assert running and "training 1/2 (50%) | rl success" in seen, seen + rest
    assert "training 2/2 (100%)" in rest and process.returncode == 0
