"""Evaluation as the field reports RL: mean@k and pass@k at temperature 1 on the final
checkpoints of ``bench/learning.py``'s runs, on the test panel and the out-of-distribution
panel, each reported once per configuration.

    python bench/pass_at_k.py --out runs/bench-learning --arms bapo+scaling-inter,bc-continued --seeds 0 1 2
    python bench/pass_at_k.py --report-only --out bench/results/learning/NAME --arms ... --seeds ...

Each finished run of ``--out/ENV/ARM/seed-S`` is played by ``agentgym eval --model RUN --k K
--temperature 1`` on every panel of :data:`PANELS` (it plays as the run's held-out evaluation
did: reply format, constrained commands), into ``RUN/final-eval/PANEL`` (an interrupted
evaluation resumes there). Each task's successes go to ``RUN/final-eval/PANEL/outcomes.json``
(task -> one 0/1 per sample), which is all the tables read: ``bench/learning.py --save``
copies it, so the tables rebuild from the repository. Per panel and arm: mean@k, pass@4 and
pass@k (unbiased, per task), over task x seed with the protocol's 95% interval, and pass@k
paired per task against ``--reference``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from learning import BC_ARM, console, finished, run_dir
from rich.table import Table

from agentgym.play.evaluation import pass_at_k
from agentgym.records.trajectory import read_jsonl
from agentgym.trainers import heldout

PANELS = {"textworld": {"test": None, "ood": 16}}
"""Env -> panel (split) -> its turn limit (None: the run's own held-out limit, 8 on textworld).
textworld's ``ood`` split is the next harder difficulty on held-out seeds; the expert wins
each of its 32 games within 12 turns (30 within 9; bench/RESULTS.md), so 16 leaves a policy
room for two wrong moves and back where the easy panel's 8 leaves none on its longest games."""
FINAL_EVAL = "final-eval"
OUTCOMES = "outcomes.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="textworld", choices=sorted(PANELS))
    parser.add_argument("--arms", required=True, help="comma-separated arms of bench/learning.py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-learning"))
    parser.add_argument("--k", type=int, default=8, help="samples per task at temperature 1")
    parser.add_argument("--reference", default=BC_ARM, help="the arm pass@k is paired against")
    parser.add_argument("--report-only", action="store_true", help="print the tables; evaluate nothing")
    args = parser.parse_args()
    if args.k < 4:
        parser.error("--k must be at least 4 (the tables give pass@4)")
    root, arms = args.out / args.env, args.arms.split(",")
    if not args.report_only:
        for seed in args.seeds:
            for arm in arms:
                if finished(folder := run_dir(root, arm, seed)):
                    evaluate(args.env, folder, args.k)
    for panel in PANELS[args.env]:
        console.print(pass_table(root, arms, args.seeds, panel, args.k, args.reference))


def evaluate(env: str, folder: Path, k: int) -> None:
    """``folder``'s final checkpoint on every panel, ``k`` samples a task at temperature 1."""
    for panel, max_turns in PANELS[env].items():
        out = folder / FINAL_EVAL / panel
        if (out / OUTCOMES).exists():
            continue
        command = [sys.executable, "-m", "agentgym.cli", "eval", "--env", env, "--model", str(folder)]
        command += ["--split", panel, "--k", str(k), "--temperature", "1", "--concurrency", "32"]
        command += ["--out", str(out)] + (["--max-turns", str(max_turns)] if max_turns else [])
        console.print(f"[bold]{folder} on {panel}[/bold]: {' '.join(command)}")
        subprocess.run(command, check=True)
        (out / OUTCOMES).write_text(json.dumps(task_successes(out / "trajectories.jsonl"), indent=1) + "\n")


def task_successes(trajectories: Path) -> dict[str, list[int]]:
    """Task id -> one 0/1 per sampled episode, from an eval's trajectories."""
    by_task: dict[str, list[int]] = {}
    for record in read_jsonl(trajectories):
        by_task.setdefault(record["task_id"], []).append(int(bool(record.get("success"))))
    return dict(sorted(by_task.items()))


def passes(k: int) -> list[int]:
    """The pass@j the tables give: 4 and k."""
    return sorted({4, k})


def per_task(folder: Path, panel: str, k: int) -> dict[str, dict[str, float]]:
    """Figure -> task -> value of one run on ``panel`` (empty: not evaluated there)."""
    path = folder / FINAL_EVAL / panel / OUTCOMES
    if not path.exists():
        return {}
    successes = json.loads(path.read_text())
    return {
        f"mean@{k}": {t: sum(s) / len(s) for t, s in successes.items()},
        **{f"pass@{j}": {t: pass_at_k(len(s), sum(s), j) for t, s in successes.items()} for j in passes(k)},
    }


def pass_table(root: Path, arms: list[str], seeds: list[int], panel: str, k: int, reference: str) -> Table:
    """Per arm: mean@k, pass@4, pass@k over task x seed, and pass@k paired against ``reference``."""
    table = Table(title=f"{root.name}, {panel} panel: final checkpoints at T = 1, k = {k}, % [95% interval]")
    figures = [f"mean@{k}", *(f"pass@{j}" for j in passes(k))]
    columns = ["arm", "seeds", *figures, f"pass@{k} vs {reference} (paired)"]
    for column in columns:
        table.add_column(column)
    runs = {arm: {s: per_task(run_dir(root, arm, s), panel, k) for s in seeds} for arm in {*arms, reference}}
    for arm in arms:
        done = {s: values for s, values in runs[arm].items() if values}
        if not done:
            table.add_row(arm, "0", "not evaluated yet", *[""] * (len(columns) - 3))
            continue
        cells = [heldout.summarise([v[f] for v in done.values()]).points() for f in figures]
        pairs = [
            (runs[reference][s][f"pass@{k}"], v[f"pass@{k}"]) for s, v in done.items() if runs[reference][s]
        ]
        versus = heldout.compare(pairs).gain.points() if pairs and arm != reference else ""
        table.add_row(arm, str(len(done)), *cells, versus)
    return table


if __name__ == "__main__":
    main()
