"""Our engine against TRL's (``agentgym train --engine trl``) on the same run: env, model,
algorithm, seeds, steps and batch; wall time per step and held-out success.

    python bench/trl_vs_ours.py --seeds 0 1 2 --out runs/trl-vs-ours \
        --save bench/results/trl-vs-ours/choice-2026-11-28
    python bench/trl_vs_ours.py --report-only --out bench/results/trl-vs-ours/choice-2026-11-28

On textworld from one cloned checkpoint (clone with our engine, ``--set steps=0``):

    agentgym train --algo bapo --schedule scaling-inter --set steps=0 --out runs/cloned
    python bench/trl_vs_ours.py --seeds 0 1 2 --out runs/trl-vs-ours-tw --textworld runs/cloned \
        --save bench/results/trl-vs-ours/textworld-2026-11-29

Each (engine, seed) is one ``agentgym train`` in its own process, one at a time; a finished
run is not trained again. The table reads every run's ``metrics.jsonl``: a step's wall
time is its rollouts and updates (ours: ``wait_s + update_s``; TRL's: ``step_s``, the time
between two rounds' ends), without the held-out evaluations. ``--save`` copies each run's
metrics and manifest (no weights) so the table is rebuilt from the repository.
Figures: bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ENGINES = ("ours", "trl")
SETTINGS = {
    "algo": "bapo",
    "env": "choice",
    "schedule": "fixed",
    "max_turns": 1,
    "bc_steps": 0,
    "curriculum": "all",
    "steps": 6,
    "tasks_per_step": 2,
    "group_size": 8,
    "max_new_tokens": 6,
    "agent_format": "plain",
    "learning_rate": 1e-3,
    "rl_learning_rate": 1e-3,
    "minibatch_size": 16,
    "micro_batch_size": 8,
    "eval_tasks": 16,
    "kl_coef": 0.0,
}
"""tests/test_trl.py's learning run: BAPO on `choice`, SmolLM2-135M, both engines."""

TEXTWORLD = {
    "algo": "bapo",
    "schedule": "scaling-inter",
    "env": "textworld",
    "bc_steps": 0,
    "curriculum": "all",
}
"""The default run's RL phase (its other settings are the defaults) from a cloned
checkpoint (``--model``): every train task the expert finishes, as TRL's sampler draws them."""


def train(engine: str, seed: int, folder: Path, settings: dict) -> None:
    if (folder / "manifest.json").exists():
        return
    shutil.rmtree(folder, ignore_errors=True)
    flags = [arg for key, value in (settings | {"seed": seed}).items() for arg in ("--set", f"{key}={value}")]
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--engine",
        engine,
        "--out",
        str(folder),
        *flags,
    ]
    subprocess.run(command, check=True)


def step_seconds(record: dict) -> float:
    return record["step_s"] if "step_s" in record else record["wait_s"] + record["update_s"]


def summary(folder: Path) -> dict:
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r.get("phase") == "rl"]
    return {
        "step_s": statistics.fmean(step_seconds(r) for r in steps),
        "rollout_s": statistics.fmean(r["rollout_s"] for r in steps),
        "before": records[0]["eval_success_rate"],
        "after": steps[-1]["eval_success_rate"],
        "train_success": [round(r["success_rate"], 2) for r in steps],
        "outcomes": [r for r in records if "eval_outcomes" in r][-1]["eval_outcomes"],
    }


def report(out: Path, seeds: list[int]) -> str:
    from agentgym.trainers.heldout import GAIN, summarise

    rows = ["| engine | s per step (mean over steps and seeds) | rollouts, s | held-out before → after (per seed) | after, claim [95%] |",
            "| --- | --- | --- | --- | --- |"]  # fmt: skip
    ends = {}
    for engine in ENGINES:
        runs = [summary(out / engine / f"seed-{seed}") for seed in seeds]
        ends[engine] = [r["outcomes"] for r in runs]  # each held-out task's outcome at the end
        before = ", ".join(f"{r['before']:.2f}" for r in runs)
        after = ", ".join(f"{r['after']:.2f}" for r in runs)
        rows.append(
            f"| {engine} | {statistics.fmean(r['step_s'] for r in runs):.1f} | "
            f"{statistics.fmean(r['rollout_s'] for r in runs):.1f} | {before} → {after} | "
            f"{summarise(ends[engine]).points()} |"
        )
    paired = [
        {task: trl[task] - ours[task] for task in ours}
        for trl, ours in zip(ends["trl"], ends["ours"], strict=True)
    ]
    gap = summarise(paired, GAIN)
    per_episode = gap.per_episode
    rows.append(
        f"\ntrl − ours, held-out at the end: {gap.points()} (per-episode "
        f"[{100 * per_episode.low:.1f}, {100 * per_episode.high:.1f}])"
    )
    return "\n".join(rows)


def save(out: Path, saved: Path, seeds: list[int]) -> None:
    for engine in ENGINES:
        for seed in seeds:
            target = saved / engine / f"seed-{seed}"
            target.mkdir(parents=True, exist_ok=True)
            for name in ("metrics.jsonl", "manifest.json", "config.yaml"):
                if (out / engine / f"seed-{seed}" / name).exists():
                    shutil.copy(out / engine / f"seed-{seed}" / name, target / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/trl-vs-ours"))
    parser.add_argument("--save", type=Path, help="copy each run's metrics and manifest here")
    parser.add_argument("--report-only", action="store_true", help="read the runs in --out, train nothing")
    parser.add_argument(
        "--textworld", metavar="CLONED_RUN", help="the default run's RL on textworld from this run"
    )
    args = parser.parse_args()
    settings = SETTINGS if args.textworld is None else TEXTWORLD | {"model": args.textworld}
    if not args.report_only:
        for seed in args.seeds:
            for engine in ENGINES:
                train(engine, seed, args.out / engine / f"seed-{seed}", settings)
    print(report(args.out, args.seeds))
    if args.save:
        save(args.out, args.save, args.seeds)


if __name__ == "__main__":
    main()
