"""The CLI as a script or a pipe sees it: every table column whole and `--help` wider than
80 columns when output is not a terminal; Ctrl-C on a long command says what was saved
and the command that resumes; a collect that resumes."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.records.trajectory import read_jsonl, read_trajectories
from conftest import REPO

runner = CliRunner()


def piped(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``agentgym ARGS`` with output to a pipe and no ``COLUMNS``: what a script or CI sees."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "TERMINAL_WIDTH")}
    return subprocess.run(
        [sys.executable, "-m", "agentgym.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def test_piped_output_keeps_every_column_and_help_is_wider_than_80(
    textworld_url: str, tmp_path: Path
) -> None:
    done = piped("eval", "--env", "textworld", "--policy", "expert", "--url", textworld_url, "--n", "2",
                 "--out", str(tmp_path / "ev"))  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "…" not in done.stdout, done.stdout  # rich cut nothing to fit 80 columns
    header = next(line for line in done.stdout.splitlines() if "challenge" in line and "episodes" in line)
    assert all(name in header for name in ("success", "score", "turns", "unparsed", "rejected", "errored"))
    help_text = piped("eval", "--help").stdout
    assert max(len(line) for line in help_text.splitlines()) > 80
    assert "…" not in help_text


def interrupt_when(proc: subprocess.Popen, ready: Callable[[], bool], timeout: float = 300) -> str:
    """Ctrl-C ``proc`` once ``ready()``; its output after exiting."""
    deadline = time.monotonic() + timeout
    while not ready() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0]
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=120)
    return output


def resume_command(output: str) -> list[str]:
    """The command the interrupted one printed, runnable here (``agentgym`` -> this Python)."""
    command = shlex.split(output.split("Resume with: ", 1)[1].splitlines()[0])
    assert command[0] == "agentgym"
    return [sys.executable, "-m", "agentgym.cli", *command[1:]]


def test_ctrl_c_during_eval_says_what_is_saved_and_how_to_resume(
    tiny_model_dir: Path, textworld_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "ev"  # no --out given: the message must name the folder it chose
    args = ["eval", "--env", "textworld", "--url", textworld_url, "--policy", "hf", "--model",
            str(tiny_model_dir), "--n", "6", "--concurrency", "1", "--max-turns", "2", "--max-new-tokens", "4"]  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-m", "agentgym.cli", *args], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    saved = next_eval_file(tmp_path)
    output = interrupt_when(proc, lambda: saved.exists() and saved.read_text().count("\n") > 0)
    assert proc.returncode == 130, output
    assert "interrupted: " in output and "finished episodes are saved in" in output, output
    command = resume_command(output)
    assert "--out" in command
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    out = tmp_path / command[command.index("--out") + 1]
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 6 and results["resumed"] >= 1


def next_eval_file(cwd: Path) -> Path:
    """The trajectories file of the eval folder that appears under ``cwd/runs/eval``."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        folders = list((cwd / "runs" / "eval").glob("*")) if (cwd / "runs" / "eval").exists() else []
        if folders:
            return folders[0] / "trajectories.jsonl"
        time.sleep(0.2)
    raise AssertionError("eval created no results folder")


def test_ctrl_c_during_training_names_the_checkpoint_and_the_resume(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    settings = {"model": str(tiny_model_dir), "steps": 5000, "bc_steps": 0, "tasks_per_step": 2, "group_size": 2,
                "max_new_tokens": 4, "agent_format": "plain", "eval_every": 0, "eval_tasks": 2,
                "micro_batch_size": 4, "minibatch_size": 4}  # fmt: skip
    args = ["train", "--algo", "grpo", "--schedule", "fixed", "--env", "choice", "--out", str(run)]
    args += [f"--set={key}={value}" for key, value in settings.items()]
    proc = subprocess.Popen([sys.executable, "-m", "agentgym.cli", *args], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    # Two step folders: the first is complete (the second is begun only after it is saved).
    output = interrupt_when(proc, lambda: len(list((run / "checkpoints").glob("step-*"))) >= 2)
    assert proc.returncode == 130, output
    assert f"the newest complete checkpoint is {run}/checkpoints/step-" in output, output
    command = resume_command(output)
    assert command[command.index("--out") + 1] == str(run) and command[-1] == "--resume"


def test_collect_resumes_keeping_what_it_wrote(textworld_url: str, tmp_path: Path) -> None:
    for output_format in ("trajectory", "agentgym"):
        out = tmp_path / f"{output_format}.jsonl"
        base = ["collect", "--env", "textworld", "--n", "3", "--url", textworld_url, "--format", output_format,
                "--out", str(out)]  # fmt: skip
        assert runner.invoke(app, base).exit_code == 0
        first = out.read_text().splitlines(keepends=True)[0]
        out.write_text(first + '{"torn')  # one episode kept, and a line a crash cut short
        result = runner.invoke(app, [*base, "--resume"])
        assert result.exit_code == 0, result.output
        assert "wrote 2 of 2 episodes" in result.output and "1 kept from before" in result.output
        records = list(read_jsonl(out))
        assert records[0] == json.loads(first) and len(records) == 3
        if output_format == "trajectory":
            assert len({t.task_id for t in read_trajectories(out)}) == 3  # no task twice
        result = runner.invoke(app, base)  # without --resume the file is replaced
        assert result.exit_code == 0 and "kept" not in result.output and len(list(read_jsonl(out))) == 3


HEAVY = ("torch", "transformers", "vllm")
"""What a command that only reads or checks a config must not import (seconds on a busy machine)."""


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["train", "--recipe", "dapo-webshop", "--set", "steps=3", "--print-config"], 0),
        (["train", "--set", "steps=-1", "--print-config"], 2),  # a config problem, told as fast
        (["train", "--set", "stepz=1"], 2),
        (["eval", "--help"], 0),
    ],
)
def test_commands_that_only_read_a_config_import_no_torch(args: list[str], code: int) -> None:
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['agentgym', *{args!r}]\n"
        "try:\n    runpy.run_module('agentgym.cli', run_name='__main__')\n"
        "except SystemExit as exit:\n    status = exit.code or 0\n"
        f"print('IMPORTED', [m for m in {HEAVY!r} if m in sys.modules], status, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO
    )
    assert f"IMPORTED [] {code}" in done.stderr, done.stdout + done.stderr


def test_every_presets_estimator_and_clip_rule_is_registered() -> None:
    """What lets a config naming them be checked without the registry (and torch)."""
    from agentgym.trainers.algorithms import ADVANTAGE_ESTIMATORS, CLIP_RULES
    from agentgym.trainers.presets import PRESETS

    assert {p.advantage for p in PRESETS.values()} <= ADVANTAGE_ESTIMATORS.keys()
    assert {p.clip_rule for p in PRESETS.values()} <= CLIP_RULES.keys()
