"""Which algorithm makes the agent better: several training configurations ("arms") at the
same budget, on the same tasks and seeds, and a table of what each reached.

    python bench/learning.py                        # textworld, every arm, seeds 0 1 2
    python bench/learning.py --env search --arms bapo+scaling-inter,grpo+fixed,bc-continued
    python bench/learning.py --seeds 0 --arms bapo+scaling-inter --set steps=6
    python bench/learning.py --arms bapo+scaling-inter,placebo --reference placebo --seeds 0 1 2 3 4 5
    python bench/learning.py --arms bapo+scaling-inter,lr-5e-4 --reference bapo+scaling-inter \
        --variant "lr-5e-4 bapo+scaling-inter rl_learning_rate=5e-4"

Every run is ``agentgym train`` in its own process (one at a time: two torch jobs on two
cores slow both) into ``--out/<env>/<arm>/seed-<s>``. Behaviour cloning is the same in
every arm, so it runs once per seed (``--out/<env>/_bc-start/seed-<s>``, ``steps=0``) and
each arm starts as a copy of that run with its own config, resumed from the last cloning
checkpoint: every arm of a seed starts RL from the very same weights (and the same "after
BC" evaluation), and no arm pays for cloning again. A finished run (its last metrics record
is there) is skipped on a re-run and an interrupted one resumes from its checkpoint, so the
bench can run across several sittings; the table is printed from whatever has finished.

Arms share every setting (the env's defaults, as ``agentgym train --env ENV`` resolves
them, plus ``--set``) and differ only as named: the algorithm, fixed horizon
(``max_turns`` = the schedule's last round) or ScalingInter-RL, and ``bc-continued``: no
RL, behaviour cloning continued for as long as the same seed's first RL arm spent in RL
(its wall time over a BC step's), so the table shows whether RL beats more imitation; and
``placebo``: the default RL arm with each step's advantages shuffled across its episodes
(``shuffle_advantages``), so ``--reference placebo`` shows whether the reward signal, not
the updates themselves, moves the model.
A ``--variant "NAME ARM KEY=VALUE ..."`` is a further arm: ARM with those settings, for
re-deriving one default against its runner-up. It shares the seed's cloning start, so
its settings must be ones of the RL phase (learning rate, rounds, tasks per step), not of
cloning; ``--reference`` names the arm the paired column is against. A
``--whole-run-variant`` is the same with settings that cloning reads too (``dtype``): it
clones its own start with them (``--out/<env>/_bc-start-<NAME>/seed-<s>``), so the arm is a
whole default run under its settings.
Every arm is evaluated greedily at the env's fixed held-out turn limit on the same
validation tasks (``eval_every`` = the RL steps: after cloning and at the end), where
choices are made, and on the same frozen test tasks, reported once per configuration.
Seeds run one after another, every arm of a seed before the next seed, so an interrupted
bench leaves whole seeds.

Two tables, validation then test: held-out success after behaviour cloning and at the end (over task x seed, 95%
interval, and each seed's), the gain over ``bc-continued`` paired per task within each seed
(an interval holding 0 means the difference is inside the noise) and its per-episode
interval, train success at the last RL step, the token entropy of the last update, and mean
wall time per run. The 95% intervals are the wider of the per-seed t over seeds and the task
x seed cluster bootstrap (``trainers/heldout.py``, ``docs/protocol.md``); the per-episode one
pools every task x seed as independent and is secondary. The table is also written to
``--out/<env>/table.txt``, with ``manifest.json`` beside it (``trainers/manifest.py``:
every run's per-task outcomes too). ``--save bench/results/learning/NAME`` copies what the
tables read of each run (config, manifest, metrics without per-update lists) for git, as
each run finishes, and rebuilds the tables from the copy alone; ``--report-only --out``
that folder prints them again. Runs from more than one commit are flagged: such a table
is exploratory.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from agentgym.policies.models import converted_folder
from agentgym.records.run_folder import MetricsLog, read_json_object
from agentgym.trainers import heldout, manifest
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.config_files import env_layer

BC_ARM = "bc-continued"
TABLE_FILE = "table.txt"
CAPTION = (
    "95% intervals: the wider of the per-seed t over seeds and the task x seed cluster bootstrap "
    "(one seed: tasks only, seed variance not in it); per-episode: pooled as independent, secondary"
)
START = "_bc-start"
"""The folder of each seed's behaviour-cloning run, which every arm starts from."""
FINAL_EVAL = "final-eval"
"""A run's evaluations of its final checkpoint (``bench/pass_at_k.py``): the cloned start's
are its own, so a fork does not inherit them."""
ARMS: dict[str, dict[str, Any]] = {
    "bapo+scaling-inter": {"algo": "bapo", "schedule": "scaling-inter"},
    "bapo+fixed": {"algo": "bapo", "schedule": "fixed"},
    "grpo+scaling-inter": {"algo": "grpo", "schedule": "scaling-inter"},
    "grpo+fixed": {"algo": "grpo", "schedule": "fixed"},
    "gigpo+scaling-inter": {"algo": "gigpo", "schedule": "scaling-inter"},
    # Off-policy: one-step-off async, every minibatch sampled by an older policy, so the
    # clip bounds have ratios to act on; the pair differs only in the clip rule.
    "bapo+async": {"algo": "bapo", "schedule": "scaling-inter", "mode": "async"},
    "bapo+async+fixed-clip": {
        "algo": "bapo",
        "schedule": "scaling-inter",
        "mode": "async",
        "clip_rule": "fixed",
    },
    # The placebo: the default run with each step's advantages shuffled across its episodes.
    "placebo": {"algo": "bapo", "schedule": "scaling-inter", "shuffle_advantages": True},
    BC_ARM: {},
}
"""Arm name -> TrainConfig overrides. The first arm is the reference ``bc-continued`` is timed by."""
DEFAULT_ARMS = {
    "textworld": ["bapo+scaling-inter", "bapo+fixed", "grpo+scaling-inter", "grpo+fixed", BC_ARM],
    "search": ["bapo+scaling-inter", "grpo+fixed", BC_ARM],
}

console = Console(width=200)  # a wide table: never fold it into an 80-column terminal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="textworld")
    parser.add_argument("--arms", help=f"comma-separated, from: {', '.join(ARMS)}")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=Path("runs/bench-learning"))
    parser.add_argument(
        "--set", dest="settings", action="append", default=[], help="TrainConfig KEY=VALUE for every arm"
    )
    parser.add_argument(
        "--variant",
        dest="variants",
        action="append",
        default=[],
        metavar='"NAME ARM KEY=VALUE ..."',
        help="a further arm: ARM with these TrainConfig settings of the RL phase",
    )
    parser.add_argument(
        "--whole-run-variant",
        dest="whole_run_variants",
        action="append",
        default=[],
        metavar='"NAME ARM KEY=VALUE ..."',
        help="a further arm whose settings apply to cloning too: it clones its own start with them",
    )
    parser.add_argument("--reference", default=BC_ARM, help="the arm the paired column is against")
    parser.add_argument(
        "--report-only", action="store_true", help="print the table from finished runs; train nothing"
    )
    parser.add_argument(
        "--save",
        type=Path,
        metavar="DIR",
        help="also copy what the tables are built from (each run's config, manifest and metrics "
        "without per-update lists) to DIR/ENV/ARM/seed-S, for bench/results/ in git",
    )
    args = parser.parse_args()
    known = dict(ARMS)
    own_starts: dict[str, dict[str, Any]] = {}  # whole-run variant -> its cloning start's settings
    for text in [*args.variants, *args.whole_run_variants]:
        words = text.split()
        if len(words) < 2 or words[1] not in ARMS:
            parser.error(f"variant {text!r}: give NAME ARM KEY=VALUE ..., ARM from: {', '.join(ARMS)}")
        name, arm, *pairs = words
        settings = parse_settings(pairs)
        known[name] = {**ARMS[arm], **settings}
        if text in args.whole_run_variants:
            own_starts[name] = settings
    names = args.arms.split(",") if args.arms else DEFAULT_ARMS.get(args.env, list(ARMS))
    unknown = [arm for arm in [*names, args.reference] if arm not in known]
    if unknown:
        parser.error(f"unknown arms {unknown}; arms: {', '.join(known)}")
    arms = {name: known[name] for name in names}
    shared = {"env": args.env, **parse_settings(args.settings)}
    # What `agentgym train --env ENV` starts from; fails here, before any run, on a bad
    # --set or --variant setting.
    try:
        base = TrainConfig.from_dict(env_layer(args.env)).with_overrides(shared)
        for overrides in arms.values():
            base.with_overrides(overrides)
    except ValueError as exc:
        parser.error(str(exc))
    shared.setdefault("eval_every", max(1, base.steps))  # validation after cloning and at the end
    if not args.report_only:
        for seed in args.seeds:
            # bc-continued is timed by an RL arm of the same seed: RL arms first.
            for arm in sorted(arms, key=lambda a: a == BC_ARM):
                train(args.out / args.env, arm, seed, base, shared, arms, own_starts.get(arm))
                if args.save:  # as each run finishes: a lost run folder loses nothing the tables read
                    save_results(args.out / args.env, args.save / args.env, [arm], [seed])
    report(args.out / args.env, list(arms), args.seeds, args.reference)
    if args.save:
        save_results(args.out / args.env, args.save / args.env, list(arms), args.seeds)
        report(args.save / args.env, list(arms), args.seeds, args.reference)  # rebuilt from the copy alone


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` strings as TrainConfig overrides, each value read as YAML."""
    return {key: yaml.safe_load(value) for key, _, value in (s.partition("=") for s in settings)}


def run_dir(root: Path, arm: str, seed: int) -> Path:
    return root / arm / f"seed-{seed}"


def finished(folder: Path) -> bool:
    records = _records(folder)
    return bool(records) and records[-1]["step"] == _total_steps(folder)


def train(
    root: Path,
    arm: str,
    seed: int,
    base: TrainConfig,
    shared: dict[str, Any],
    arms: dict[str, dict[str, Any]],
    own_start: dict[str, Any] | None = None,
) -> None:
    """Train ``arm``'s run of ``seed`` from the seed's cloning start (its own, cloned with
    ``own_start``'s settings, for a whole-run variant)."""
    folder = run_dir(root, arm, seed)
    if finished(folder):
        console.print(f"[dim]{arm} seed {seed}: done earlier, skipped[/dim]")
        return
    if not (folder / "metrics.jsonl").exists():
        if own_start is None:
            start = cloned_start(root, seed, shared)
        else:
            start = cloned_start(root, seed, {**shared, **own_start}, f"{START}-{arm}")
        overrides = {**shared, **arm_overrides(arm, seed, base, root, arms), "seed": seed}
        fork(start, folder, base.with_overrides(overrides | {"output_dir": str(folder)}))
    run_train(f"{arm} seed {seed}", folder, None)


def cloned_start(root: Path, seed: int, shared: dict[str, Any], name: str = START) -> Path:
    """The seed's behaviour-cloning run (no RL steps) in ``root/name``, trained on first use."""
    folder = run_dir(root, name, seed)
    if not finished(folder):
        run_train(f"behaviour cloning, seed {seed}", folder, {**shared, "seed": seed, "steps": 0})
    return folder


def fork(start: Path, folder: Path, config: TrainConfig) -> None:
    """``folder`` becomes a copy of the cloning run ``start`` with ``config``: resuming it
    continues from the last cloning checkpoint under the arm's settings."""
    shutil.copytree(
        start,
        folder,
        ignore=shutil.ignore_patterns(
            "heldout.json", "manifest.json", "curves.png", "tensorboard", FINAL_EVAL
        ),
    )
    config.save(folder / "config.yaml")


def run_train(label: str, folder: Path, overrides: dict[str, Any] | None) -> None:
    """``agentgym train`` into ``folder``: a new run with ``overrides``, or (None, or a run
    already there) the saved run resumed from its last checkpoint."""
    command = [sys.executable, "-m", "agentgym.cli", "train", "--out", str(folder)]
    if overrides is None or (folder / "metrics.jsonl").exists():
        command.append("--resume")  # the config is the saved one
    else:
        command += [arg for key, value in overrides.items() for arg in ("--set", f"{key}={_yaml(value)}")]
    console.print(f"[bold]{label}[/bold]: {' '.join(command)}")
    subprocess.run(command, check=True)


def arm_overrides(
    arm: str, seed: int, base: TrainConfig, root: Path, arms: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The arm's TrainConfig overrides (``arms``: name -> overrides, in order). Fixed
    horizon: the schedule's last round, so both schedules end at the same horizon."""
    if arm == BC_ARM:
        return {"bc_steps": base.bc_steps + extra_bc_steps(root, list(arms), seed), "steps": 0}
    overrides = dict(arms[arm])
    if overrides.get("schedule") == "fixed":
        overrides["max_turns"] = max(base.rounds)
    return overrides


def extra_bc_steps(root: Path, arms: list[str], seed: int) -> int:
    """BC steps that take as long as the reference RL arm's RL phase took (same seed), at a
    cloning step's median time: the first steps' one-off costs (playing the expert's
    demonstrations, warm-up) are not paid again by cloning continued, and would cut its
    budget by a third if averaged in."""
    reference = next((a for a in arms if a != BC_ARM), None)
    records = _records(run_dir(root, reference, seed)) if reference else []
    bc = [r["step_s"] for r in records if r["phase"] == "bc"]
    rl = [r["step_s"] for r in records if r["phase"] != "bc"]
    if not bc or not rl:
        raise SystemExit(
            f"{BC_ARM} is timed by a finished {reference} run of seed {seed}: run that arm first"
        )
    return max(1, round(sum(rl) / statistics.median(bc)))


def report(root: Path, arms: list[str], seeds: list[int], reference: str = BC_ARM) -> None:
    """Print the tables; write them to ``root/table.txt``, with ``root/manifest.json`` beside."""
    tables: list[Table | str] = [build_table(root, arms, seeds, panel, reference) for panel in heldout.PANELS]
    tables.append(dynamics_table(root, arms, seeds))
    if note := commits_note(root, arms, seeds):
        tables.append(note)
    text = Console(width=200, record=True, file=io.StringIO())
    for table in tables:
        console.print(table)
        text.print(table)
    if root.is_dir():
        (root / TABLE_FILE).write_text(text.export_text())
        manifest.write_manifest(root, bench_manifest(root, arms, seeds))


def build_table(
    root: Path, arms: list[str], seeds: list[int], panel: str = "test", reference_arm: str = BC_ARM
) -> Table:
    """The table of every arm's finished runs under ``root`` on ``panel`` (:data:`PANELS`),
    each paired against ``reference_arm``."""
    key = heldout.PANELS[panel]
    table = Table(
        title=f"held-out success on {root.name}, {panel} tasks (greedy), % [95% interval]",
        caption=CAPTION,
    )
    columns = ["arm", "seeds", "after BC", "held-out at end", "per seed", f"vs {reference_arm} (paired)"]
    columns += ["per-episode", "train success", "entropy", "step time/run"]
    for column in columns:
        table.add_column(column)
    reference = {s: _final_outcomes(run_dir(root, reference_arm, s), key) for s in seeds}
    for arm in arms:
        done = [s for s in seeds if finished(run_dir(root, arm, s))]
        if not done:
            table.add_row(arm, "0", "not run yet", *[""] * (len(columns) - 3))
            continue
        paired = reference if arm != reference_arm else {}
        table.add_row(arm, str(len(done)), *arm_figures(root, arm, done, paired, key))
    return table


def arm_figures(
    root: Path, arm: str, seeds: list[int], reference: dict[int, dict[str, float]], key: str = "eval_outcomes"
) -> list[str]:
    outcomes = {s: _final_outcomes(run_dir(root, arm, s), key) for s in seeds}
    if not all(outcomes.values()):
        return ["not evaluated on this panel", *[""] * 7]
    at_end = heldout.summarise(list(outcomes.values()))
    before = [heldout.outcomes_by_phase(_records(run_dir(root, arm, s)), key)[0] for s in seeds]
    after_bc = heldout.summarise(before).points() if any(before) and arm != BC_ARM else ""
    per_seed = ", ".join(f"{100 * sum(o.values()) / len(o):.0f}" for o in outcomes.values())
    pairs = [(reference[s], outcomes[s]) for s in seeds if reference.get(s)]
    versus = heldout.compare(pairs).gain if pairs else None
    last_rl = [
        next((r for r in reversed(_records(run_dir(root, arm, s))) if r["phase"] == "rl"), {}) for s in seeds
    ]
    train = _mean_of(r.get("success_rate") for r in last_rl)
    entropy = _mean_of(r.get("entropy") for r in last_rl)
    wall = _mean_of(sum(r["step_s"] for r in _records(run_dir(root, arm, s))) for s in seeds)
    return [
        after_bc,
        at_end.points(),
        per_seed,
        "" if versus is None else versus.points(),
        "" if versus is None else versus.per_episode.points(),
        "" if train is None else f"{100 * train:.0f}",
        "" if entropy is None else f"{entropy:.3f}",
        "" if wall is None else f"{wall / 60:.1f} min",
    ]


def dynamics_table(root: Path, arms: list[str], seeds: list[int]) -> Table:
    """What the clipped updates saw, per RL arm (means over seeds): the token entropy at the
    first and last RL step, the ratio spread (p05-p95, mean over RL steps), the share of
    tokens the bounds held, the share of updates whose BAPO search moved the bounds, and
    how the searches ended."""
    table = Table(title=f"RL updates on {root.name}: what the clip bounds had to act on")
    columns = ["arm", "seeds", "entropy first -> last", "ratio p05-p95", "tokens clipped", "bounds moved"]
    for column in [*columns, "BAPO searches"]:
        table.add_column(column)
    for arm in arms:
        steps = [
            [r for r in _records(run_dir(root, arm, s)) if r["phase"] == "rl"]
            for s in seeds
            if finished(run_dir(root, arm, s))
        ]
        steps = [run for run in steps if run]
        if not steps:
            continue
        flat = [r for run in steps for r in run]
        first, last = (_mean_of(run[i].get("entropy") for run in steps) for i in (0, -1))
        low, high = (_mean_of(r.get(key) for r in flat) for key in ("ratio_p05", "ratio_p95"))
        clipped = _mean_of(r.get("clip_frac_low", 0) + r.get("clip_frac_high", 0) for r in flat)
        moved = _mean_of(r.get("bounds_moved") for r in flat)
        searches: dict[str, int] = {}
        for r in flat:
            for outcome, count in r.get("bapo_search", {}).items():
                searches[outcome] = searches.get(outcome, 0) + count
        table.add_row(
            arm,
            str(len(steps)),
            f"{first:.3f} -> {last:.3f}" if first is not None and last is not None else "",
            f"{low:.3f}-{high:.3f}" if low is not None and high is not None else "",
            "" if clipped is None else f"{100 * clipped:.2f}%",
            "" if moved is None else f"{100 * moved:.0f}% of updates",
            ", ".join(f"{o} {n}" for o, n in searches.items()),
        )
    return table


def commits_note(root: Path, arms: list[str], seeds: list[int]) -> str | None:
    """A warning when the finished runs' manifests name more than one git commit: the
    protocol compares arms run from one commit, so such a table is exploratory."""
    commits = {
        _run_manifest(folder).get("git_commit") or "unknown"
        for arm in arms
        for s in seeds
        if finished(folder := run_dir(root, arm, s))
    }
    if len(commits) < 2:
        return None
    named = ", ".join(sorted(c[:12] for c in commits))
    return f"[bold red]The runs come from {len(commits)} commits ({named}): exploratory, not under the protocol.[/]"


def save_results(root: Path, dest: Path, arms: list[str], seeds: list[int]) -> None:
    """Copy what the tables read of each finished run under ``root`` to ``dest``, in the same
    layout: its config and manifest, its final evaluations' per-task successes
    (``bench/pass_at_k.py``), and its metrics without the per-update lists (``updates``: most
    of the file), so ``--report-only --out`` the copy rebuilds the tables."""
    for arm in arms:
        for seed in seeds:
            source, target = run_dir(root, arm, seed), run_dir(dest, arm, seed)
            if not finished(source):
                continue
            target.mkdir(parents=True, exist_ok=True)
            kept = [source / "config.yaml", source / manifest.MANIFEST_FILE]
            for path in [*kept, *source.glob("final-eval/*/outcomes.json")]:  # bench/pass_at_k.py's
                if path.exists():
                    (target / path.relative_to(source)).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target / path.relative_to(source))
            records = [{k: v for k, v in r.items() if k != "updates"} for r in _records(source)]
            (target / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    console.print(f"saved the finished runs' configs, manifests and metrics under {dest}")


def bench_manifest(root: Path, arms: list[str], seeds: list[int]) -> dict[str, Any]:
    """The manifest of the table: the test tasks and seeds of the finished runs, the model's
    sha256 (from the runs' own manifests, else the local model folder the config names), the
    generator, each arm's config as its first finished run saved it, and each run's per-task
    outcomes at every held-out evaluation (``ARM/seed-S``: panel -> step -> task -> 1/0)."""
    folders = [run_dir(root, arm, s) for arm in arms for s in seeds if finished(run_dir(root, arm, s))]
    configs = {folder.parent.name: _config(folder) for folder in reversed(folders)}  # the first seed wins
    tasks = sorted({task for folder in folders for task in _final_outcomes(folder)})
    hashes = {_run_manifest(folder).get("model_sha256") for folder in folders} - {None}
    if not hashes:
        hashes = {_spec_sha256(str(c["model"])) for c in configs.values() if c.get("model")} - {None}
    generators = sorted({str(c["generator"]) for c in configs.values() if c.get("generator")})
    built = manifest.build_manifest(
        tasks=tasks,
        seeds=sorted({int(folder.name.removeprefix("seed-")) for folder in folders}),
        model_sha256=hashes.pop() if len(hashes) == 1 else None,  # None: no model, or runs disagree
        generator=", ".join(generators) or None,
        config={arm: configs[arm] for arm in arms if arm in configs},
        outcomes={
            f"{folder.parent.name}/{folder.name}": heldout.evaluations(_records(folder)) for folder in folders
        },
    )
    return built | runs_in_common(folders)


RUN_FIELDS = ("git_commit", "torch", "transformers", "python", "dtype", "machine")
"""What made the figures, read from the runs' own manifests: a table rebuilt later (from
the repository, another checkout) names the runs' commit, libraries, dtype and machine,
not its own."""


def runs_in_common(folders: list[Path]) -> dict[str, Any]:
    """Each of :data:`RUN_FIELDS` the runs' manifests agree on: None where they differ or a
    run has none (as :func:`commits_note` counts them); nothing where no run has a manifest."""
    runs = [_run_manifest(folder) for folder in folders]
    if not any(runs):
        return {}
    common = {}
    for field in RUN_FIELDS:
        values = {json.dumps(run.get(field), sort_keys=True) for run in runs}
        common[field] = json.loads(values.pop()) if len(values) == 1 else None
    return common


def _final_outcomes(folder: Path, key: str = "eval_outcomes") -> dict[str, float]:
    """Each task's outcome at the run's last evaluation on ``key``'s panel (empty: not
    finished, or never evaluated there)."""
    if not finished(folder):
        return {}
    return next((r[key] for r in reversed(_records(folder)) if r.get(key)), {})


def _config(folder: Path) -> dict[str, Any]:
    return yaml.safe_load((folder / "config.yaml").read_text()) or {}


def _run_manifest(folder: Path) -> dict[str, Any]:
    return read_json_object(folder / manifest.MANIFEST_FILE) or {}


def _spec_sha256(spec: str) -> str | None:
    """The sha256 of the local model folder ``spec`` names (an alias or ``.gguf`` already
    converted, or a Hugging Face folder); None for anything else. Converts nothing."""
    folder = converted_folder(spec) or Path(spec)
    return manifest.model_sha256(folder) if (folder / "config.json").is_file() else None


def _records(folder: Path) -> list[dict[str, Any]]:
    return MetricsLog(folder / "metrics.jsonl").read()  # a line torn by an interrupted run is skipped


def _total_steps(folder: Path) -> int | None:
    config = folder / "config.yaml"
    if not config.exists():
        return None
    values = yaml.safe_load(config.read_text())
    return values["bc_steps"] + values["steps"]


def _mean_of(values: Any) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()


if __name__ == "__main__":
    main()
