"""The data behind ``curves.png``: which panels are drawn, split or left out, and the
held-out intervals."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from agentgym.records.curves import wilson_interval, x_positions
from agentgym.records.run_folder import MetricsLog
from agentgym.trainers.plot import _title, drawn_panels, plot_run


def records() -> list[dict]:
    bc = [
        {"step": s, "phase": "bc", "loss": 2.0 / s, "grad_norm": 3.0, "lr": 1e-3, "max_turns": 8}
        for s in (1, 2)
    ]
    rl = [
        {"step": s, "phase": "rl", "loss": 0.1 * s, "success_rate": 0.25 * s, "max_turns": 8, "lr": 5e-4}
        | {"approx_kl": 0.01 * s, "clip_frac_low": 0.0, "clip_frac_high": 0.02 * s, "grad_norm": 1.0 / s}
        | {"episodes": 8, "generated_tokens": 100 * s, "finished_at": 1000.0 + 60 * s, "step_s": 60.0}
        | {"reply_tokens_mean": 3.0 + s, "zero_advantage_share": 0.5 / s, "kl_ref": 0.001 * s}
        for s in (3, 4)
    ]
    rl[-1] |= {"eval_success_rate": 1.0, "eval_outcomes": {"a": 1.0, "b": 1.0, "c": 1.0}}
    return bc + rl


def test_panels_split_losses_by_phase_and_name_constant_ones() -> None:
    panels, constant = drawn_panels(records())
    titles = [title for title, _, _ in panels]
    assert "loss · bc" in titles and "loss · rl" in titles and "loss" not in titles
    assert {
        "gradient norm, before clipping",
        "learning rate",
        "KL, behaviour → current policy (k3)",
    } <= set(titles)
    assert "tokens held by the clip (share)" in titles  # clip_frac_high moves, so the panel stays
    assert constant == ["max turns (schedule) 8"] and "max turns (schedule)" not in titles


def test_wilson_intervals_keep_a_width_at_zero_and_at_one() -> None:
    assert wilson_interval(3, 3) == pytest.approx((0.4385, 1.0), abs=1e-4)
    low, high = wilson_interval(0, 32)
    assert low == 0.0 and high == pytest.approx(0.1072, abs=1e-4)
    # By hand: centre (0.5 + z²/64) / (1 + z²/32) = 0.5; half 1.96·√(0.25/32 + z²/4096) / 1.12005 = 0.1637.
    assert wilson_interval(16, 32) == pytest.approx((0.3363, 0.6637), abs=1e-4)


def test_the_png_is_drawn_and_titled_by_run_algo_and_env(tmp_path: Path) -> None:
    run = tmp_path / "bapo-choice" / "seed-0"
    run.mkdir(parents=True)
    log = MetricsLog(run / "metrics.jsonl")
    for record in records():
        log.log(record)
    log.close()
    (run / "config.yaml").write_text(yaml.safe_dump({"algo": "bapo", "env": "choice"}))
    assert _title(run) == "bapo-choice/seed-0 (bapo, choice)"
    assert plot_run(run).stat().st_size > 10_000
    for x in ("samples", "tokens", "wall"):
        assert plot_run(run, tmp_path / f"{x}.png", x=x).stat().st_size > 10_000
    with pytest.raises(ValueError, match="unknown x axis 'epochs'; choose one of step, samples"):
        plot_run(run, x="epochs")


def test_the_x_axis_counts_steps_episodes_tokens_or_minutes() -> None:
    history = records()
    assert x_positions(history) == {1: 1, 2: 2, 3: 3, 4: 4}
    assert x_positions(history, "samples") == {1: 0, 2: 0, 3: 8, 4: 16}
    assert x_positions(history, "tokens") == {1: 0, 2: 0, 3: 300, 4: 700}
    # step 3 began at 1180 - 60 = 1120 (the first record that says): minutes since then
    assert x_positions(history, "wall") == {1: 0, 2: 0, 3: 1.0, 4: 2.0}
    titles = [title for title, _, _ in drawn_panels(history)[0]]
    assert {"reply length (sampled tokens per turn)", "episodes without advantage (share)"} <= set(titles)
    assert "KL to the reference policy (k3)" in titles
