"""Data-parallel training: `agentgym train --nproc 2` (torchrun, gloo on CPU) computes the
same losses as one process on the same global batches.

A tiny randomly initialised Llama with SmolLM2's tokenizer keeps two processes cheap; the
steps compared are behaviour-cloning steps on `choice`'s expert episodes, whose batches
are the same in both runs (sampled rollouts would differ between runs, their losses too).
Then one RL step (BAPO, whose bound search sums P and N over ranks) must run too. Async
mode with partial rollouts must run on two ranks: each pauses and resumes its own
episodes, and both build the same batches from all ranks' episodes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_metrics

BC_STEPS = 2
SETTINGS = {
    "bc_steps": BC_STEPS,
    "bc_batch_size": 4,
    "bc_episodes": 8,
    "steps": 1,
    "tasks_per_step": 2,
    "group_size": 2,
    "minibatch_size": 4,
    "micro_batch_size": 2,
    "max_turns": 1,
    "max_new_tokens": 4,
    "agent_format": "plain",
    "eval_every": 0,
    "eval_tasks": 2,
    "concurrency": 4,
}


def train(run: Path, model: Path, nproc: int, **overrides: object) -> list[dict]:
    args = ["--algo", "bapo", "--schedule", "fixed", "--env", "choice", "--model", str(model)]
    args += [f"--set={key}={value}" for key, value in (SETTINGS | overrides).items()]
    command = [sys.executable, "-m", "agentgym.cli", "train", *args, "--out", str(run), "--nproc", str(nproc)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_metrics(run)


def test_two_processes_give_the_losses_of_one(tiny_model_dir: Path, tmp_path: Path) -> None:
    single = train(tmp_path / "one", tiny_model_dir, nproc=1)
    double = train(tmp_path / "two", tiny_model_dir, nproc=2)
    assert [r["step"] for r in double] == [1, 2, 3]  # 2 BC steps, 1 RL step, logged once each
    for one, two in zip(single[:BC_STEPS], double[:BC_STEPS], strict=True):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4), (one, two)
    rl = double[-1]
    assert rl["phase"] == "rl" and rl["episodes"] == SETTINGS["tasks_per_step"] * SETTINGS["group_size"]
    # One minibatch, sampled by the current weights: every ratio is 1, so BAPO searched nothing.
    assert rl["bapo_search"] == {"on-policy": 1} and "clip_high" not in rl
    assert 0.0 <= rl["positive_share"] <= 1.0
    rollouts = (tmp_path / "two" / "rollouts" / "step-000003.jsonl").read_text().splitlines()
    assert len(rollouts) == SETTINGS["tasks_per_step"] * SETTINGS["group_size"]  # both ranks' episodes
    assert (tmp_path / "two" / "checkpoints" / "latest").exists()


def test_two_processes_train_async_with_partial_rollouts(tiny_model_dir: Path, tmp_path: Path) -> None:
    history = train(
        tmp_path / "async",
        tiny_model_dir,
        nproc=2,
        env="textworld",
        agent_format="react",
        bc_steps=0,
        steps=3,
        max_turns=2,
        mode="async",
        partial_rollout_tokens=4,  # every turn spends it: each episode spans two collections
        max_staleness=2,
    )
    assert [r["step"] for r in history] == [1, 2, 3]
    assert [r["fresh_episodes"] for r in history] == [0, 4, 4]  # both ranks' groups, once complete
    assert [r["staleness_max"] for r in history] == [0, 1, 2]  # step 2's groups began at version 0
