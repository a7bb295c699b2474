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

from agentgym.servers.launcher import free_port
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


def train_arguments(run: Path, model: Path, **overrides: object) -> list[str]:
    args = ["train", "--algo", "bapo", "--schedule", "fixed", "--env", "choice", "--model", str(model)]
    return [
        *args,
        *(f"--set={key}={value}" for key, value in (SETTINGS | overrides).items()),
        "--out",
        str(run),
    ]


ONE_THREAD = {**os.environ, "OMP_NUM_THREADS": "1"}


def train(run: Path, model: Path, nproc: int, **overrides: object) -> list[dict]:
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        *train_arguments(run, model, **overrides),
        "--nproc",
        str(nproc),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=ONE_THREAD)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_metrics(run)


@pytest.fixture(scope="module")
def single(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """One process's run: what several processes must reproduce."""
    return train(tmp_path_factory.mktemp("one") / "run", tiny_model_dir, nproc=1)


def assert_same_cloning_losses(single: list[dict], several: list[dict]) -> None:
    assert [r["step"] for r in several] == [1, 2, 3]  # 2 BC steps, 1 RL step, logged once each
    for one, two in zip(single[:BC_STEPS], several[:BC_STEPS], strict=True):
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4), (one, two)


def test_two_processes_give_the_losses_of_one(
    single: list[dict], tiny_model_dir: Path, tmp_path: Path
) -> None:
    double = train(tmp_path / "two", tiny_model_dir, nproc=2)
    assert_same_cloning_losses(single, double)
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


def test_two_nodes_on_loopback_give_the_losses_of_one(
    single: list[dict], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two "nodes" as a cluster launches them (docs/training.md): one torchrun each, the
    same flags and run folder, meeting at a c10d rendezvous; they train as two processes of
    one machine do."""
    run = tmp_path / "nodes"
    endpoint = f"127.0.0.1:{free_port()}"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1"]
    torchrun += ["--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", "--rdzv-id=two-nodes"]
    command = [*torchrun, "-m", "agentgym.cli", *train_arguments(run, tiny_model_dir)]
    nodes = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ONE_THREAD)
        for _ in range(2)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-3000:] for o in outputs)
    assert_same_cloning_losses(single, run_metrics(run))
    rollouts = (run / "rollouts" / "step-000003.jsonl").read_text().splitlines()
    assert len(rollouts) == SETTINGS["tasks_per_step"] * SETTINGS["group_size"]  # both nodes' episodes


def test_several_processes_without_a_run_folder_are_refused(tiny_model_dir: Path) -> None:
    """Each node resolves the run folder itself: the default one is named by the time."""
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--env",
        "choice",
        "--model",
        str(tiny_model_dir),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env={**ONE_THREAD, "WORLD_SIZE": "2"})
    assert done.returncode == 2 and "--out" in done.stdout + done.stderr
