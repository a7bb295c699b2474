"""Training throughput: update tokens/s, rollout episodes/min, the share of wall time in
generation / env / update, and peak memory, from a short real training run.

    python bench/train.py [--env textworld] [--algo bapo] [--set KEY=VALUE ...]
    python bench/train.py --modes sync,async [--set KEY=VALUE ...]

Runs `agentgym train` in-process with the given overrides (default: the embedded default
run), then reads the run's metrics.jsonl. The rollout's wall time is split between
generation and env in proportion to the episodes' summed waits on each.

``--modes`` trains the same config once per mode (``mode=sync``, ``mode=async``) and
compares their RL steps: wall time per step, how busy the generator (a collection in
flight) and the trainer (an update running) kept, and the machine's CPU idle share.
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

import yaml

from agentgym.records.run_folder import MetricsLog
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.loop import Trainer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="textworld")
    parser.add_argument("--algo", default="bapo")
    parser.add_argument("--set", dest="settings", action="append", default=[], help="TrainConfig KEY=VALUE")
    parser.add_argument("--from-run", type=Path, help="report an existing run folder instead of training")
    parser.add_argument(
        "--modes", help="comma-separated modes to compare on the same config, e.g. sync,async"
    )
    args = parser.parse_args()
    if args.from_run:
        records = MetricsLog(args.from_run / "metrics.jsonl").read()
        report(records, sum(r.get("rollout_s", 0) + r.get("update_s", 0) for r in records), peak_known=False)
        return
    overrides = {k: yaml.safe_load(v) for k, _, v in (s.partition("=") for s in args.settings)}
    config = TrainConfig(algo=args.algo, env=args.env).with_overrides(overrides)
    if args.modes:
        compare_modes(config, args.modes.split(","))
        return
    records, wall = train(config)
    report(records, wall)


def train(config: TrainConfig) -> tuple[list[dict], float]:
    run_dir = Path(tempfile.mkdtemp(prefix="agentgym-bench-train-"))
    started = time.perf_counter()
    Trainer(config, run_dir).run()
    wall = time.perf_counter() - started
    print(f"run folder: {run_dir}")
    return MetricsLog(run_dir / "metrics.jsonl").read(), wall


def compare_modes(config: TrainConfig, modes: list[str]) -> None:
    """One run per mode on ``config``; a table of their RL steps."""
    rows = []
    for mode in modes:
        records, _ = train(config.with_overrides({"mode": mode}))
        rl = [r for r in records if r["phase"] == "rl"]
        wall = sum(r["step_s"] for r in rl)
        updates = [u for r in rl for u in r.get("updates", [])]
        rows.append(
            (
                mode,
                wall / len(rl),
                sum(r["rollout_s"] for r in rl) / wall,
                sum(r["update_s"] for r in rl) / wall,
                sum(r["cpu_idle_share"] * r["step_s"] for r in rl) / wall,
                _mean(r["staleness_mean"] for r in rl),
                _mean(u["clip_low"] for u in updates),
                _mean(u["clip_high"] for u in updates),
                _mean(u["ratio_p95"] - u["ratio_p05"] for u in updates),
                records[-1].get("eval_success_rate", 0.0),
            )
        )
    print(
        "mode   s/step  generator busy  trainer busy  CPU idle  staleness  c_low  c_high  ratio p95-p05  held-out"
    )
    for row in rows:
        print(
            "{:<6} {:6.1f}  {:14.0%}  {:12.0%}  {:8.0%}  {:9.2f}  {:5.2f}  {:6.2f}  {:13.4f}  {:8.2f}".format(
                *row
            )
        )
    if len(rows) > 1:
        print(f"speed-up per step of {rows[1][0]} over {rows[0][0]}: {rows[0][1] / rows[1][1]:.2f}x")


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def report(records: list[dict], wall: float, peak_known: bool = True) -> None:
    """Print the figures; ``wall`` is the run's wall time (for ``--from-run``: the summed
    rollout and update time, so start-up and evaluation are left out of the shares)."""
    rl = [r for r in records if r["phase"] == "rl"]
    bc = [r for r in records if r["phase"] == "bc"]
    rollout = sum(r["rollout_s"] for r in rl)
    update = sum(r["update_s"] for r in records)
    waits = sum(r["generation_s_sum"] + r["env_s_sum"] for r in rl) or 1.0
    generation = rollout * sum(r["generation_s_sum"] for r in rl) / waits
    env = rollout - generation
    episodes = sum(r["episodes"] for r in rl)
    rl_update = sum(r["update_s"] for r in rl)
    tokens = sum(r.get("update_tokens", 0) for r in rl)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"wall {wall:.0f}s: {len(bc)} bc steps, {len(rl)} rl steps")
    print(f"rollout episodes/min       {60 * episodes / rollout:8.1f}" if rollout else "no rollouts")
    print(
        f"generated tokens/s         {sum(r['generated_tokens'] for r in rl) / rollout:8.1f}"
        if rollout
        else ""
    )
    print(f"rl update tokens/s         {tokens / rl_update:8.1f}" if rl_update else "")
    print(
        f"wall share: generation {generation / wall:5.1%}  env {env / wall:5.1%}  update {update / wall:5.1%}  "
        f"other {(wall - rollout - update) / wall:5.1%}"
    )
    if peak_known:
        print(f"peak RSS                   {peak:8.0f} MiB")


if __name__ == "__main__":
    main()
