"""Evaluation as the field reports RL: mean@k and pass@k at temperature 1 on the final
checkpoints of ``bench/learning.py``'s runs, on the test panel and the out-of-distribution
panel, and greedy success on the out-of-distribution panel, each reported once per
configuration; and how often the exported final model ends its replies by itself on the
run's last validation evaluation (the stop rate a ``forced_end_coef`` is chosen on).

    python bench/pass_at_k.py --out runs/bench-learning --arms bapo+scaling-inter,bc-continued --seeds 0 1 2 \
        --save bench/results/learning/NAME
    python bench/pass_at_k.py --panels ood-greedy --out runs/bench-learning --arms ... --seeds ...
    python bench/pass_at_k.py --report-only --out bench/results/learning/NAME --arms ... --seeds ...

Each finished run of ``--out/ENV/ARM/seed-S`` is played by ``agentgym eval --model RUN`` on
every panel of :data:`PANELS` (or of ``--panels``): a sampled panel ``--k K --temperature
1``, a greedy one once a task at temperature 0, both as the run's held-out evaluation
played (reply format, constrained commands), into ``RUN/final-eval/PANEL`` (an interrupted
evaluation resumes there); a stop panel exports the final checkpoint (``agentgym export``)
and regenerates every reply of the run's last evaluation on its split in plain
transformers (``bench/stop_check.py``). Each task's outcomes go to
``RUN/final-eval/PANEL/outcomes.json`` (task -> one 0/1 per episode, or per reply on a stop
panel), which is all the tables read: ``--save DIR`` copies it there as each run's
evaluation ends (as ``bench/learning.py --save`` does), so the tables rebuild from the
repository. Per panel and arm, over task x seed with the protocol's 95% interval: a sampled
panel's mean@k, pass@4 and pass@k (unbiased, per task), paired per task against
``--reference`` on pass@k; a greedy panel's success and a stop panel's stop rate, each
paired on itself.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from learning import BC_ARM, FINAL_EVAL, console, finished, run_dir, save_results
from rich.table import Table

from agentgym.play.evaluation import pass_at_k
from agentgym.records.trajectory import read_jsonl
from agentgym.trainers import heldout


@dataclass(frozen=True)
class Panel:
    """A split a final checkpoint is played on, and how."""

    split: str
    max_turns: int | None = None
    """None: the run's own held-out limit (8 on textworld)."""
    how: Literal["sampled", "greedy", "stops"] = "sampled"
    """k episodes a task at T = 1; one at temperature 0, as held-out evaluation plays; or
    the run's own last evaluation on ``split`` replayed by the exported model."""


PANELS = {
    "textworld": {
        "test": Panel("test"),
        "ood": Panel("ood", 16),
        "ood-greedy": Panel("ood", 16, how="greedy"),
        "stops-validation": Panel("validation", how="stops"),
    }
}
"""Env -> panel name -> panel. textworld's ``ood`` split is the next harder difficulty on
held-out seeds; the expert wins each of its 32 games within 12 turns (30 within 9;
bench/RESULTS.md), so 16 leaves a policy room for two wrong moves and back where the easy
panel's 8 leaves none on its longest games. Its greedy panel costs an eighth of the
sampled one (a sampled OOD panel takes about 40 minutes a run here)."""
SHOWN = {
    "sampled": ("mean@{k}", "at T = 1, k = {k}"),
    "greedy": ("success", "greedy"),
    "stops": ("stopped", "exported, replies that end"),
}
"""How a panel plays -> its table's first figure and how its title says it was played."""
OUTCOMES = "outcomes.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="textworld", choices=sorted(PANELS))
    parser.add_argument("--arms", required=True, help="comma-separated arms of bench/learning.py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-learning"))
    parser.add_argument("--k", type=int, default=8, help="samples per task at temperature 1")
    parser.add_argument("--panels", help="comma-separated panels to evaluate (default: all of the env's)")
    parser.add_argument("--reference", default=BC_ARM, help="the arm each arm is paired against")
    parser.add_argument("--report-only", action="store_true", help="print the tables; evaluate nothing")
    parser.add_argument(
        "--save",
        type=Path,
        metavar="DIR",
        help="copy each run's outcomes (with what bench/learning.py --save copies) to DIR/ENV/ARM/seed-S "
        "as soon as its evaluation ends, for bench/results/ in git",
    )
    args = parser.parse_args()
    if args.k < 4:
        parser.error("--k must be at least 4 (the tables give pass@4)")
    panels = PANELS[args.env]
    names = args.panels.split(",") if args.panels else list(panels)
    if unknown := sorted(set(names) - set(panels)):
        parser.error(f"unknown panels {unknown}; {args.env} has: {', '.join(panels)}")
    chosen = {name: panels[name] for name in names}
    root, arms = args.out / args.env, args.arms.split(",")
    if not args.report_only:
        for seed in args.seeds:
            for arm in arms:
                if finished(folder := run_dir(root, arm, seed)):
                    evaluate(args.env, folder, args.k, chosen)
                    if args.save:  # up to 40 minutes of evaluation never live only in a run folder
                        save_results(root, args.save / args.env, [arm], [seed])
    for name, panel in panels.items():
        console.print(pass_table(root, arms, args.seeds, name, panel, args.k, args.reference))


def evaluate(env: str, folder: Path, k: int, panels: dict[str, Panel]) -> None:
    """``folder``'s final checkpoint on each of ``panels``."""
    for name, panel in panels.items():
        out = folder / FINAL_EVAL / name
        if (out / OUTCOMES).exists():
            continue
        if panel.how == "stops":
            check_stops(folder, panel.split, out)
            continue
        samples = (
            ["--k", "1", "--temperature", "0"]
            if panel.how == "greedy"
            else ["--k", str(k), "--temperature", "1"]
        )
        command = [sys.executable, "-m", "agentgym.cli", "eval", "--env", env, "--model", str(folder)]
        command += ["--split", panel.split, *samples, "--concurrency", "32", "--out", str(out)]
        command += ["--max-turns", str(panel.max_turns)] if panel.max_turns else []
        console.print(f"[bold]{folder} on {name}[/bold]: {' '.join(command)}")
        subprocess.run(command, check=True)
        (out / OUTCOMES).write_text(json.dumps(task_successes(out / "trajectories.jsonl"), indent=1) + "\n")


def check_stops(folder: Path, split: str, out: Path) -> None:
    """``folder``'s final checkpoint exported, replaying the run's last ``split`` evaluation."""
    last = max((folder / "rollouts" / split).glob("step-*.jsonl"))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as exported:
        model = Path(exported) / "model"
        subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "export", str(folder), "--out", str(model)], check=True
        )
        check = [sys.executable, str(Path(__file__).with_name("stop_check.py")), str(model), str(last)]
        console.print(f"[bold]{folder} stops on {last.name}[/bold]")
        summary = subprocess.run(
            [*check, "--outcomes", str(out / OUTCOMES)], check=True, capture_output=True, text=True
        )
    (out / "stops.json").write_text(summary.stdout)


def task_successes(trajectories: Path) -> dict[str, list[int]]:
    """Task id -> one 0/1 per sampled episode, from an eval's trajectories."""
    by_task: dict[str, list[int]] = {}
    for record in read_jsonl(trajectories):
        by_task.setdefault(record["task_id"], []).append(int(bool(record.get("success"))))
    return dict(sorted(by_task.items()))


def pass_ks(panel: Panel, k: int) -> list[int]:
    """The pass@j a panel's table gives: 4 and k on a sampled panel, none on the others."""
    return sorted({4, k}) if panel.how == "sampled" else []


def figures(panel: Panel, k: int) -> list[str]:
    """The figures a panel's table gives, the paired one last: success, stopped, or mean@k,
    pass@4 and pass@k."""
    return [SHOWN[panel.how][0].format(k=k), *(f"pass@{j}" for j in pass_ks(panel, k))]


def per_task(folder: Path, name: str, panel: Panel, k: int) -> dict[str, dict[str, float]]:
    """Figure -> task -> value of one run on panel ``name`` (empty: not evaluated there)."""
    path = folder / FINAL_EVAL / name / OUTCOMES
    if not path.exists():
        return {}
    successes = json.loads(path.read_text())
    return {
        figures(panel, k)[0]: {t: sum(s) / len(s) for t, s in successes.items()},
        **{
            f"pass@{j}": {t: pass_at_k(len(s), sum(s), j) for t, s in successes.items()}
            for j in pass_ks(panel, k)
        },
    }


def pass_table(
    root: Path, arms: list[str], seeds: list[int], name: str, panel: Panel, k: int, reference: str
) -> Table:
    """Per arm: the panel's figures over task x seed, and the last one paired against ``reference``."""
    how = SHOWN[panel.how][1].format(k=k)
    table = Table(title=f"{root.name}, {name} panel: final checkpoints {how}, % [95% interval]")
    shown = figures(panel, k)
    columns = ["arm", "seeds", *shown, f"{shown[-1]} vs {reference} (paired)"]
    for column in columns:
        table.add_column(column)
    runs = {
        arm: {s: per_task(run_dir(root, arm, s), name, panel, k) for s in seeds} for arm in {*arms, reference}
    }
    for arm in arms:
        done = {s: values for s, values in runs[arm].items() if values}
        if not done:
            table.add_row(arm, "0", "not evaluated yet", *[""] * (len(columns) - 3))
            continue
        cells = [heldout.summarise([v[f] for v in done.values()]).points() for f in shown]
        pairs = [(runs[reference][s][shown[-1]], v[shown[-1]]) for s, v in done.items() if runs[reference][s]]
        versus = heldout.compare(pairs).gain.points() if pairs and arm != reference else ""
        table.add_row(arm, str(len(done)), *cells, versus)
    return table


if __name__ == "__main__":
    main()
