"""Held-out intervals that count seeds and tasks as clusters (``trainers/heldout.py``), the
manifest written beside every report (``trainers/manifest.py``), and the tables that use
them: the trainer's end-of-run table and ``bench/learning.py``'s, from synthetic metrics
(nothing is trained here)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agentgym.contract import cache
from agentgym.policies.dtypes import native_bf16_cpu
from agentgym.policies.models import ModelSource
from agentgym.trainers import heldout, manifest
from agentgym.trainers.config import TrainConfig

ROOT = Path(__file__).resolve().parent.parent


def tasks(n: int) -> list[str]:
    return [f"task-{i:02d}" for i in range(n)]


def run_with_gain(solved_before: int, solved_after: int, n: int = 10) -> tuple[dict, dict]:
    """One seed's (before, after) outcomes: the first ``solved_*`` of ``n`` tasks solved."""
    names = tasks(n)
    before = {t: float(i < solved_before) for i, t in enumerate(names)}
    after = {t: float(i < solved_after) for i, t in enumerate(names)}
    return before, after


# ----- the t quantile ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("df", "expected"), [(1, 12.7062), (2, 4.3027), (3, 3.1824), (4, 2.7764), (10, 2.2281), (30, 2.0423)]
)
def test_the_t_quantile_matches_the_printed_table(df: int, expected: float) -> None:
    assert heldout.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert heldout.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_the_t_quantile_tends_to_the_normal_one() -> None:
    assert heldout.t_quantile(0.975, 120) == pytest.approx(1.9799, abs=1e-4)
    assert heldout.t_quantile(0.975, 10_000) == pytest.approx(heldout.Z95, abs=1e-3)
    assert heldout.t_quantile(0.995, 5) == pytest.approx(4.0321, abs=1e-4)


# ----- the per-seed t interval ----------------------------------------------------------


def test_the_per_seed_interval_over_three_seeds_by_hand() -> None:
    """Gains 0.10, 0.20, 0.30 (1, 2, 3 of 10 tasks won by RL): mean 0.2, sd 0.1,
    t(0.975, 2) = 4.3027, half-width 4.3027 * 0.1 / sqrt(3) = 0.2484."""
    runs = [run_with_gain(2, 2 + k) for k in (1, 2, 3)]
    result = heldout.compare(runs)
    gain = result.gain
    assert gain.seed_means == pytest.approx((0.1, 0.2, 0.3))
    assert gain.mean == pytest.approx(0.2)
    assert gain.per_seed is not None
    assert (gain.per_seed.low, gain.per_seed.high) == (
        pytest.approx(-0.048414, abs=1e-5),
        pytest.approx(0.448414, abs=1e-5),
    )
    # The seeds differ more than the tasks do: the claim is the per-seed interval.
    assert gain.claim == gain.per_seed and gain.claim.width > gain.bootstrap.width
    assert result.seeds == 3 and result.tasks == 10 and result.note is None


def test_one_seed_has_no_per_seed_interval() -> None:
    assert heldout.seed_t_interval([0.4]) is None
    result = heldout.compare([run_with_gain(3, 5)])
    assert result.gain.per_seed is None and result.gain.claim == result.gain.bootstrap
    assert result.note == heldout.ONE_SEED_NOTE
    assert "seed variance is not in it" in heldout.caption(result)


# ----- the cluster bootstrap --------------------------------------------------------------


def test_identical_tasks_give_a_bootstrap_interval_of_zero_width() -> None:
    cells = [dict.fromkeys(tasks(8), 1.0) for _ in range(3)]
    assert heldout.cluster_bootstrap(cells) == heldout.Interval(1.0, 1.0)
    result = heldout.compare([(dict.fromkeys(tasks(8), 0.0), dict.fromkeys(tasks(8), 1.0))] * 3)
    assert result.gain.bootstrap == heldout.Interval(1.0, 1.0)
    assert result.gain.per_seed == heldout.Interval(1.0, 1.0)


def test_one_seed_two_tasks_bootstrap_by_hand() -> None:
    """Tasks worth 0 and 1: a resample's mean is 0, 0.5 or 1 with chances 1/4, 1/2, 1/4, so
    the 2.5% and 97.5% percentiles are 0 and 1."""
    assert heldout.cluster_bootstrap([{"a": 0.0, "b": 1.0}]) == heldout.Interval(0.0, 1.0)


def test_the_bootstrap_resamples_seeds_too() -> None:
    """Every seed's tasks alike within the seed, seeds 0 and 1 apart: resampling tasks only
    would give zero width; resampling seeds gives 0, 1/2 or 1 (chances 1/4, 1/2, 1/4)."""
    cells = [dict.fromkeys(tasks(4), 0.0), dict.fromkeys(tasks(4), 1.0)]
    assert heldout.cluster_bootstrap(cells) == heldout.Interval(0.0, 1.0)
    assert heldout.cluster_bootstrap(cells[:1]) == heldout.Interval(0.0, 0.0)


def test_the_bootstrap_is_deterministic_and_its_resamples_configurable() -> None:
    cells = [{t: float((i * 5 + s) % 3 == 0) for i, t in enumerate(tasks(32))} for s in range(3)]
    first = heldout.cluster_bootstrap(cells)
    assert heldout.cluster_bootstrap(cells) == first
    assert heldout.cluster_bootstrap(cells, resamples=500) == heldout.cluster_bootstrap(cells, resamples=500)
    runs = [run_with_gain(2, 2 + k) for k in (1, 2, 3)]
    assert heldout.compare(runs, resamples=300).resamples == 300
    assert heldout.compare(runs).to_dict() == heldout.compare(runs).to_dict()


def test_seeds_that_evaluated_different_tasks_still_resample() -> None:
    cells = [{"a": 1.0, "b": 0.0}, {"b": 1.0, "c": 1.0}]
    interval = heldout.cluster_bootstrap(cells)
    assert 0.0 <= interval.low <= 0.75 <= interval.high <= 1.0


# ----- the claim: the wider ---------------------------------------------------------------


def test_the_claim_is_the_wider_of_the_two_intervals() -> None:
    # Seeds far apart: the per-seed t (2 df) is the wider.
    apart = heldout.compare([run_with_gain(2, 2 + k) for k in (0, 4, 8)]).gain
    assert apart.per_seed is not None and apart.per_seed.width > apart.bootstrap.width
    assert apart.claim == apart.per_seed
    # Seeds alike (the same mean), tasks apart: the per-seed interval has zero width and
    # the bootstrap over tasks is the wider.
    alike = heldout.compare([run_with_gain(2, 6), run_with_gain(2, 6), run_with_gain(2, 6)]).gain
    assert alike.per_seed is not None and alike.per_seed.width == pytest.approx(0.0)
    assert alike.per_seed.low == pytest.approx(0.4)
    assert alike.bootstrap.width > 0 and alike.claim == alike.bootstrap
    for figure in (apart, alike):
        assert figure.claim.width == max(figure.per_seed.width, figure.bootstrap.width)
    assert heldout.wider(None, heldout.Interval(0.1, 0.2)) == heldout.Interval(0.1, 0.2)


def test_clustered_seeds_give_a_wider_interval_than_pooled_episodes() -> None:
    """RL gains 0 tasks of 32 in seed 0, 16 in seed 1, all 32 in seed 2: pooled as 96
    independent pairs the gain looks known to ±0.10; over three seeds it is not."""
    runs = [run_with_gain(0, solved, n=32) for solved in (0, 16, 32)]
    gain = heldout.compare(runs).gain
    assert gain.mean == pytest.approx(0.5)
    per_episode = gain.per_episode.high - gain.per_episode.low
    assert per_episode == pytest.approx(2 * heldout.Z95 * 0.5026 / 96**0.5, abs=1e-3)
    assert gain.claim.width > 3 * per_episode
    assert gain.bootstrap.width > 2 * per_episode  # the bootstrap alone sees the seeds too


# ----- what the trainer prints and saves ------------------------------------------------


def test_rows_carry_the_claim_and_the_per_episode_interval(tmp_path: Path) -> None:
    before, after = run_with_gain(1, 3, n=4)
    result = heldout.compare([(before, after)])
    labels = [row[0] for row in heldout.rows(result)]
    assert labels[0] == "held-out success after behaviour cloning"
    gain_row = heldout.rows(result, cloned=False)[2]
    assert gain_row == (
        "gain (after RL - before, paired)",
        result.gain.points(),
        f"[{100 * result.gain.per_episode.low:.1f}, {100 * result.gain.per_episode.high:.1f}]",
    )
    saved = json.loads(heldout.save(tmp_path, result, sorted(before)).read_text())
    assert saved["note"] == heldout.ONE_SEED_NOTE and saved["seeds"] == 1
    assert saved["gain"]["per_seed_t"] is None and saved["gain"]["claim_from"] == "cluster_bootstrap"
    assert (saved["gain"]["low"], saved["gain"]["high"]) == (result.gain.claim.low, result.gain.claim.high)
    assert saved["gain"]["per_episode"]["n"] == 4 and saved["tasks"] == sorted(before)


def make_model_folder(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "tiny"}')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    return folder


def test_the_trainer_prints_the_table_and_writes_the_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The end of a run, on a run folder whose metrics hold the two evaluations (a
    Trainer set up by hand: no model is loaded, nothing is trained)."""
    from agentgym.records.run_folder import MetricsLog
    from agentgym.trainers.config import TrainConfig
    from agentgym.trainers.loop import Trainer

    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    model = make_model_folder(tmp_path / "model")
    trainer = Trainer(TrainConfig(bc_steps=2, steps=1, seed=7), tmp_path / "run")
    trainer.metrics = MetricsLog(tmp_path / "run" / "metrics.jsonl")
    before, after = run_with_gain(1, 3, n=4)
    trainer.metrics.log({"step": 2, "phase": "bc", "eval_outcomes": before})
    trainer.metrics.log({"step": 3, "phase": "rl", "eval_outcomes": after})
    trainer.learner = SimpleNamespace(policy=SimpleNamespace(source=ModelSource("tiny", str(model))))
    trainer._report_before_after()
    printed = " ".join(capsys.readouterr().out.split())
    assert "per-episode" in printed and "seed variance is not in it" in printed
    assert "held-out success after behaviour cloning" in printed
    assert json.loads((tmp_path / "run" / heldout.BEFORE_AFTER_FILE).read_text())["gain"]["mean"] == 0.5
    written = json.loads((tmp_path / "run" / manifest.MANIFEST_FILE).read_text())
    assert list(written) == list(manifest.FIELDS)
    assert written["tasks"] == sorted(before) and written["seeds"] == [7] and written["generator"] == "hf"
    assert written["model_sha256"] == ModelSource("tiny", str(model)).describe()["sha256"]
    assert written["config"]["seed"] == 7 and written["config"]["bc_steps"] == 2
    assert written["outcomes"] == {"validation": {}, "test": {"2": before, "3": after}}


def test_a_manifest_holds_every_field(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    model = make_model_folder(tmp_path / "model")
    record = manifest.build_manifest(
        tasks=["b", "a"],
        seeds=[0, 1],
        model_sha256=manifest.model_sha256(model),
        generator="hf",
        config={"lr": 1e-3},
        dtype="bfloat16",
    )
    assert set(record) == set(manifest.FIELDS)
    # The machine that ran it: `dtype: auto` and the speed both depend on its CPU.
    features = record["machine"]["cpu_features"]
    assert record["dtype"] == "bfloat16" and record["machine"]["cores"] == os.cpu_count()
    assert set(features) <= set(manifest.CPU_FEATURES)
    assert bool({"avx512_bf16", "amx_bf16"} & set(features)) == native_bf16_cpu()
    assert record["tasks"] == ["b", "a"] and record["seeds"] == [0, 1] and record["config"] == {"lr": 1e-3}
    # The same hash `agentgym eval` records for this model folder.
    assert record["model_sha256"] == ModelSource("x", str(model)).describe()["sha256"]
    assert re.fullmatch(r"[0-9a-f]{40}", record["git_commit"] or "0" * 40)
    assert record["python"].count(".") == 2 and record["torch"] == manifest.package_version("torch")
    assert manifest.package_version("no-such-package-here") is None
    path = manifest.write_manifest(tmp_path, record)
    assert json.loads(path.read_text()) == record and path.name == "manifest.json"


def test_the_git_commit_is_none_outside_a_checkout(tmp_path: Path) -> None:
    assert manifest.git_commit(tmp_path) is None
    assert manifest.git_commit(tmp_path / "missing") is None


def test_a_file_hash_is_cached_by_size_and_mtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"weights")
    assert cache.file_sha256(weights) == hashlib.sha256(b"weights").hexdigest()
    assert (tmp_path / "cache" / "hashes" / "sha256.json").is_file()

    def unreadable(*args: Any) -> Any:
        raise AssertionError("hashed again")

    monkeypatch.setattr(cache.hashlib, "file_digest", unreadable)
    cache._HASHES.clear()  # a new process: the cache on disk answers
    assert cache.file_sha256(weights) == hashlib.sha256(b"weights").hexdigest()
    monkeypatch.undo()
    monkeypatch.setenv("AGENTGYM_CACHE", str(tmp_path / "cache"))
    weights.write_bytes(b"other weights")  # another size: hashed anew
    assert cache.file_sha256(weights) == hashlib.sha256(b"other weights").hexdigest()


# ----- bench/learning.py's table, from synthetic run folders -------------------------------


def load_bench(script: str = "learning") -> Any:
    """``bench/SCRIPT.py`` as a module (registered, as its dataclasses need)."""
    spec = importlib.util.spec_from_file_location(f"bench_{script}", ROOT / "bench" / f"{script}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fake_run(folder: Path, bc_steps: int, steps: int, before: dict, after: dict, sha: str | None) -> None:
    """A finished run: config.yaml and metrics.jsonl as the trainer writes them."""
    folder.mkdir(parents=True)
    config = {"bc_steps": bc_steps, "steps": steps, "model": "tiny", "generator": "hf", "seed": 0}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    records = [{"step": s, "phase": "bc", "loss": 1.0, "step_s": 1.0} for s in range(1, bc_steps + 1)]
    records[-1]["eval_outcomes"] = before
    records += [
        {"step": bc_steps + s, "phase": "rl", "success_rate": 0.5, "entropy": 0.25, "step_s": 3.0}
        for s in range(1, steps + 1)
    ]
    records[-1]["eval_outcomes"] = after
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if sha:
        (folder / manifest.MANIFEST_FILE).write_text(json.dumps({"model_sha256": sha}))


def finish_run(folder: Path, overrides: dict | None) -> None:
    """``run_train`` stood in for: a new run (``overrides``) finishes its cloning; a resumed
    fork finishes its RL step."""
    if overrides is not None:
        fake_run(folder, 2, 0, {"a": 1.0}, {"a": 1.0}, sha=None)
        return
    record = {"step": 3, "phase": "rl", "success_rate": 1.0, "step_s": 1.0, "eval_outcomes": {"a": 1.0}}
    with (folder / "metrics.jsonl").open("a") as log:
        log.write(json.dumps(record) + "\n")


def test_the_bench_table_and_manifest_from_saved_runs(tmp_path: Path) -> None:
    bench = load_bench()
    root = tmp_path / "textworld"
    seeds = [0, 1, 2]
    for seed, k in zip(seeds, (1, 2, 3), strict=True):
        before, after = run_with_gain(2, 2 + k)
        fake_run(bench.run_dir(root, "bapo+scaling-inter", seed), 2, 2, before, after, sha="ab" * 32)
        fake_run(bench.run_dir(root, bench.BC_ARM, seed), 4, 0, before, before, sha="ab" * 32)
    arms = ["bapo+scaling-inter", "grpo+fixed", bench.BC_ARM]
    table = bench.build_table(root, arms, seeds)
    cells = {column.header: column._cells for column in table.columns}
    expected = heldout.compare([run_with_gain(2, 2 + k) for k in (1, 2, 3)])
    assert cells["seeds"] == ["3", "0", "3"]
    assert cells["held-out at end"][0] == expected.after_rl.points()
    assert cells["after BC"][0] == expected.after_bc.points()
    assert (
        cells[f"vs {bench.BC_ARM} (paired)"][0] == expected.gain.points()
    )  # the reference stayed at "before"
    assert cells["per-episode"][0] == expected.gain.per_episode.points()
    assert cells["per seed"][0] == "30, 40, 50" and cells["after BC"][1] == "not run yet"
    bench.report(root, arms, seeds)
    assert "bapo+scaling-inter" in (root / bench.TABLE_FILE).read_text()
    written = json.loads((root / manifest.MANIFEST_FILE).read_text())
    assert set(written) == set(manifest.FIELDS)
    assert written["seeds"] == seeds and written["tasks"] == tasks(10)
    assert written["model_sha256"] == "ab" * 32 and written["generator"] == "hf"
    assert sorted(written["config"]) == sorted(["bapo+scaling-inter", bench.BC_ARM])
    # These runs logged no validation: that table says so instead of reading the test panel.
    validation = bench.build_table(root, arms, seeds, "validation")
    assert validation.columns[2]._cells[0] == "not evaluated on this panel"
    assert "validation tasks" in (root / bench.TABLE_FILE).read_text()


def test_the_bench_validation_table_reads_validation_outcomes(tmp_path: Path) -> None:
    bench = load_bench()
    root = tmp_path / "textworld"
    for seed, k in enumerate((1, 2, 3)):
        before, after = run_with_gain(2, 2 + k)
        for arm, steps, end in (("bapo+scaling-inter", 2, after), (bench.BC_ARM, 0, before)):
            folder = bench.run_dir(root, arm, seed)
            fake_run(folder, 2 + 2 * (arm == bench.BC_ARM), steps, {}, {}, sha=None)
            records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            for record in records:  # the test panel is gone; validation holds the figures
                record.pop("eval_outcomes", None)
            records[1]["val_outcomes"], records[-1]["val_outcomes"] = before, end
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = bench.build_table(root, ["bapo+scaling-inter", bench.BC_ARM], [0, 1, 2], "validation")
    cells = {column.header: column._cells for column in table.columns}
    expected = heldout.compare([run_with_gain(2, 2 + k) for k in (1, 2, 3)])
    assert cells["held-out at end"][0] == expected.after_rl.points()
    assert cells[f"vs {bench.BC_ARM} (paired)"][0] == expected.gain.points()


def test_a_variant_arm_is_paired_against_the_reference_arm(tmp_path: Path, monkeypatch) -> None:
    """``--variant`` adds an arm (a known arm with other settings) and ``--reference`` pairs
    every arm against it: how a default is re-derived against its runner-up."""
    bench = load_bench()
    root = tmp_path / "textworld"
    for seed, k in enumerate((1, 2, 3)):
        before, default = run_with_gain(2, 4)
        _, variant = run_with_gain(2, 4 + k)
        fake_run(bench.run_dir(root, "bapo+scaling-inter", seed), 2, 2, before, default, sha=None)
        fake_run(bench.run_dir(root, "lr-5e-4", seed), 2, 2, before, variant, sha=None)
    argv = ["learning.py", "--out", str(tmp_path), "--seeds", "0", "1", "2", "--report-only"]
    argv += ["--arms", "bapo+scaling-inter,lr-5e-4", "--reference", "bapo+scaling-inter"]
    monkeypatch.setattr("sys.argv", [*argv, "--variant", "lr-5e-4 bapo+scaling-inter rl_learning_rate=5e-4"])
    bench.main()
    table = bench.build_table(
        root, ["bapo+scaling-inter", "lr-5e-4"], [0, 1, 2], "test", "bapo+scaling-inter"
    )
    paired = {column.header: column._cells for column in table.columns}["vs bapo+scaling-inter (paired)"]
    expected = heldout.compare([(run_with_gain(2, 4)[1], run_with_gain(2, 4 + k)[1]) for k in (1, 2, 3)])
    assert paired == ["", expected.gain.points()]  # the reference row pairs with nothing
    assert "vs bapo+scaling-inter (paired)" in (root / bench.TABLE_FILE).read_text()
    for bad in ("lr-5e-4", "lr-5e-4 no-such-arm x=1", "lr-5e-4 bapo+scaling-inter no_such_key=1"):
        monkeypatch.setattr("sys.argv", [*argv, "--variant", bad])
        with pytest.raises(SystemExit):  # refused before any run
            bench.main()


def test_the_tables_rebuild_from_the_saved_copy_alone_and_mixed_commits_are_flagged(
    tmp_path: Path, monkeypatch
) -> None:
    """``--save DIR`` copies what the tables read (config, manifest, metrics without the
    per-update lists); ``--report-only --out DIR`` on that copy alone prints the same tables,
    and the manifest beside them holds every run's per-task outcomes. Arms from two commits
    are called exploratory."""
    bench = load_bench()
    runs, saved = tmp_path / "runs", tmp_path / "saved"
    for seed, k in enumerate((1, 2, 3)):
        before, after = run_with_gain(2, 2 + k)
        for arm, bc_steps, steps, end in (("bapo+scaling-inter", 2, 2, after), (bench.BC_ARM, 4, 0, before)):
            folder = bench.run_dir(runs / "textworld", arm, seed)
            fake_run(folder, bc_steps, steps, before, end, sha=None)
            records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
            records[-1]["updates"] = [{"loss": 1.0}] * 50  # per-update lists: the copy leaves them out
            (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
            run_manifest = {
                "git_commit": "c0ffee" * 7,
                "dtype": "float32",
                "machine": {"cpu": "x", "cores": 2},
            }
            (folder / manifest.MANIFEST_FILE).write_text(json.dumps(run_manifest))
            (folder / "final-eval" / "ood").mkdir(parents=True)  # bench/pass_at_k.py's, and its trajectories
            (folder / "final-eval" / "ood" / "outcomes.json").write_text('{"a": [1, 0]}')
            (folder / "final-eval" / "ood" / "trajectories.jsonl").write_text("{}\n")
    argv = [
        "learning.py",
        "--seeds",
        "0",
        "1",
        "2",
        "--report-only",
        "--arms",
        f"bapo+scaling-inter,{bench.BC_ARM}",
    ]
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(runs), "--save", str(saved)])
    bench.main()
    original = (runs / "textworld" / bench.TABLE_FILE).read_text()
    assert "exploratory" not in original
    copy = bench.run_dir(saved / "textworld", "bapo+scaling-inter", 0)
    assert sorted(p.name for p in copy.iterdir()) == [
        "config.yaml",
        "final-eval",
        "manifest.json",
        "metrics.jsonl",
    ]
    assert [p.name for p in (copy / "final-eval" / "ood").iterdir()] == ["outcomes.json"]
    assert "updates" not in (copy / "metrics.jsonl").read_text()
    shutil.rmtree(runs)
    monkeypatch.setattr("sys.argv", [*argv, "--out", str(saved)])
    bench.main()
    assert (saved / "textworld" / bench.TABLE_FILE).read_text() == original
    rebuilt = json.loads((saved / "textworld" / manifest.MANIFEST_FILE).read_text())
    assert rebuilt["outcomes"]["bapo+scaling-inter/seed-1"]["test"]["4"] == run_with_gain(2, 4)[1]
    assert rebuilt["git_commit"] == "c0ffee" * 7  # the runs' commit, not the rebuilding checkout's
    assert rebuilt["dtype"] == "float32" and rebuilt["machine"] == {"cpu": "x", "cores": 2}  # the runs' too
    (copy / manifest.MANIFEST_FILE).write_text(json.dumps({"git_commit": "beef" * 10}))
    bench.main()
    assert "2 commits" in (saved / "textworld" / bench.TABLE_FILE).read_text()
    rebuilt = json.loads((saved / "textworld" / manifest.MANIFEST_FILE).read_text())
    assert rebuilt["git_commit"] is None and rebuilt["machine"] is None  # runs disagree


def test_pass_at_k_tables_read_each_runs_final_evaluation(tmp_path: Path, monkeypatch) -> None:
    """``bench/pass_at_k.py``: mean@k, pass@4 and pass@k per task (unbiased) over task x seed,
    paired per task against the reference arm; greedy success on a greedy panel, paired
    where the reference ran, and the stop rate on a stop panel; a run not evaluated on a
    panel says so."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    bench = load_bench("pass_at_k")
    root = tmp_path / "textworld"
    samples = {  # task -> successes of 8 samples, per arm (the same in every seed)
        "bapo+scaling-inter": {"a": [1] * 8, "b": [1, 0, 0, 0, 0, 0, 0, 0], "c": [0] * 8},
        "bc-continued": {"a": [1, 1, 0, 0, 0, 0, 0, 0], "b": [0] * 8, "c": [0] * 8},
    }
    for seed in (0, 1):
        for arm, successes in samples.items():
            folder = bench.run_dir(root, arm, seed)
            fake_run(folder, 2, 2, {}, {}, sha=None)
            (folder / "final-eval" / "test").mkdir(parents=True)
            (folder / "final-eval" / "test" / "outcomes.json").write_text(json.dumps(successes))
    arms = list(samples)
    panels = bench.PANELS["textworld"]
    table = bench.pass_table(root, arms, [0, 1], "test", panels["test"], 8, "bc-continued")
    cells = {column.header: column._cells for column in table.columns}
    assert cells["mean@8"][0].startswith(f"{100 * (8 + 1) / 24:.1f} ")
    assert cells["pass@4"][0].startswith(f"{100 * (1 + 0.5) / 3:.1f} ")  # b: 1 - C(7,4)/C(8,4) = 0.5
    assert cells["pass@8"][1].startswith(f"{100 / 3:.1f} ")
    assert cells["pass@8 vs bc-continued (paired)"] == [
        heldout.compare([({"a": 1.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 1.0, "c": 0.0})] * 2).gain.points(),
        "",
    ]
    ood = bench.pass_table(root, arms, [0, 1], "ood", panels["ood"], 8, "bc-continued")
    assert ood.columns[2]._cells == ["not evaluated yet"] * 2
    for seed, arm in [(0, "bapo+scaling-inter"), (1, "bapo+scaling-inter"), (0, "bc-continued")]:
        greedy = bench.run_dir(root, arm, seed) / "final-eval" / "ood-greedy"
        greedy.mkdir(parents=True)  # one greedy episode a task
        (greedy / "outcomes.json").write_text(json.dumps({t: s[:1] for t, s in samples[arm].items()}))
    table = bench.pass_table(root, arms, [0, 1], "ood-greedy", panels["ood-greedy"], 8, "bc-continued")
    cells = {column.header: column._cells for column in table.columns}
    assert cells["seeds"] == ["2", "1"] and cells["success"][0].startswith(f"{100 * 2 / 3:.1f} ")
    assert cells["success vs bc-continued (paired)"] == [  # seed 1 has no reference run
        heldout.compare([({"a": 1.0, "b": 0.0, "c": 0.0}, {"a": 1.0, "b": 1.0, "c": 0.0})]).gain.points(),
        "",
    ]
    stops = bench.pass_table(
        root, arms, [0], "stops-validation", panels["stops-validation"], 8, "bc-continued"
    )
    assert [column.header for column in stops.columns][2:] == ["stopped", "stopped vs bc-continued (paired)"]


def test_each_run_is_saved_for_git_as_soon_as_it_is_evaluated(tmp_path: Path, monkeypatch) -> None:
    """``bench/pass_at_k.py --save``: a run's outcomes reach the saved copy when its own
    evaluation ends, so a later run that fails (or a lost machine) leaves them saved."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    bench = load_bench("pass_at_k")
    runs, saved = tmp_path / "runs", tmp_path / "saved"
    for seed in (0, 1):
        fake_run(bench.run_dir(runs / "textworld", "fe-1", seed), 2, 2, {}, {}, sha=None)

    def evaluate(env: str, folder: Path, k: int, panels: dict) -> None:
        if folder.name == "seed-1":
            raise RuntimeError("the machine went away")
        (folder / "final-eval" / "ood").mkdir(parents=True)
        (folder / "final-eval" / "ood" / "outcomes.json").write_text('{"a": [1, 0]}')

    monkeypatch.setattr(bench, "evaluate", evaluate)
    argv = ["pass_at_k.py", "--out", str(runs), "--arms", "fe-1", "--seeds", "0", "1", "--save", str(saved)]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(RuntimeError):
        bench.main()
    copy = bench.run_dir(saved / "textworld", "fe-1", 0)
    assert json.loads((copy / "final-eval" / "ood" / "outcomes.json").read_text()) == {"a": [1, 0]}
    assert (copy / "metrics.jsonl").exists() and not bench.run_dir(saved / "textworld", "fe-1", 1).exists()


def test_learning_saves_each_run_as_it_finishes(tmp_path: Path, monkeypatch) -> None:
    """``bench/learning.py --save``: a finished run is copied before the next one trains."""
    bench = load_bench()

    def fake_train(label: str, folder: Path, overrides: dict | None) -> None:
        if folder.parent.name == "bc-continued":
            raise RuntimeError("the machine went away")
        finish_run(folder, overrides)

    monkeypatch.setattr(bench, "run_train", fake_train)
    argv = ["learning.py", "--out", str(tmp_path / "runs"), "--save", str(tmp_path / "saved"), "--seeds", "0"]
    argv += ["--set", "bc_steps=2", "--set", "steps=1", "--arms", f"bapo+scaling-inter,{bench.BC_ARM}"]
    monkeypatch.setattr("sys.argv", argv)
    with pytest.raises(RuntimeError):
        bench.main()
    copy = bench.run_dir(tmp_path / "saved" / "textworld", "bapo+scaling-inter", 0)
    assert json.loads((copy / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 3


def test_a_fork_starts_without_its_cloned_starts_final_evaluations(tmp_path: Path) -> None:
    """An arm forked from a cloned start that ``pass_at_k.py`` already evaluated carries the
    start's checkpoints and history but not its final-checkpoint outcomes, which would
    otherwise stand in for the arm's own (the evaluation skips a panel already done)."""
    bench = load_bench()
    start = tmp_path / bench.START / "seed-0"
    fake_run(start, 2, 0, {"a": 1.0}, {"a": 1.0}, sha=None)
    (start / bench.FINAL_EVAL / "ood-greedy").mkdir(parents=True)
    (start / bench.FINAL_EVAL / "ood-greedy" / "outcomes.json").write_text('{"a": [1]}')
    fork = tmp_path / "fe-1" / "seed-0"
    bench.fork(start, fork, TrainConfig(forced_end_coef=1.0))
    assert (fork / "metrics.jsonl").read_text() == (start / "metrics.jsonl").read_text()
    assert yaml.safe_load((fork / "config.yaml").read_text())["forced_end_coef"] == 1.0
    assert not (fork / bench.FINAL_EVAL).exists()


def test_a_whole_run_variant_clones_its_own_start(tmp_path: Path, monkeypatch) -> None:
    """``--whole-run-variant`` settings reach cloning too (``dtype``): its arm starts from a
    cloning run of its own trained with them, while the other arms share the seed's start."""
    bench = load_bench()
    trained: dict[str, dict | None] = {}

    def fake_train(label: str, folder: Path, overrides: dict | None) -> None:
        trained[f"{folder.parent.name}/{folder.name}"] = overrides
        finish_run(folder, overrides)

    monkeypatch.setattr(bench, "run_train", fake_train)
    argv = ["learning.py", "--out", str(tmp_path), "--seeds", "0", "--set", "bc_steps=2", "--set", "steps=1"]
    argv += ["--arms", "bapo+scaling-inter,bf16", "--reference", "bapo+scaling-inter"]
    monkeypatch.setattr("sys.argv", [*argv, "--whole-run-variant", "bf16 bapo+scaling-inter dtype=bfloat16"])
    bench.main()
    assert trained["_bc-start/seed-0"].get("dtype") is None
    assert trained["_bc-start-bf16/seed-0"]["dtype"] == "bfloat16"
    assert trained["bapo+scaling-inter/seed-0"] is None and trained["bf16/seed-0"] is None  # forks resumed
    root = tmp_path / "textworld"
    for arm, dtype in (("bapo+scaling-inter", "auto"), ("bf16", "bfloat16")):
        assert yaml.safe_load((bench.run_dir(root, arm, 0) / "config.yaml").read_text())["dtype"] == dtype
