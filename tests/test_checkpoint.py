"""Run-folder checkpoints survive kills and power loss, fall back to the newest complete
one, load old run folders, and never run code from a checkpoint file; ``train --resume``
continues the folder it is given, and refuses one it would have to start over."""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

from agentgym.cli import app
from agentgym.play.play_profile import PlayProfile, write_play
from agentgym.records.run_folder import PLAY_FILE, MetricsLog, RunDir, rng_state
from agentgym.trainers.config import TrainConfig
from conftest import TINY_RUN


def _trained() -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    """A tiny model with one AdamW step taken, so the optimizer has state to restore."""
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _fresh() -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def _write_format_1(folder: Path, step: int, optimizer_payload: dict) -> None:
    """A checkpoint exactly as save_checkpoint wrote it before manifests (format 1)."""
    model, _ = _trained()
    folder.mkdir(parents=True)
    torch.save({k: v.detach() for k, v in model.named_parameters()}, folder / "trainable.pt")
    torch.save(optimizer_payload, folder / "optimizer.pt")
    (folder / "state.json").write_text(json.dumps({"step": step, "phase": "rl"}, indent=2))


class _Payload:
    """Unpickling this writes ``marker``: what a malicious run folder could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def test_latest_falls_back_to_the_newest_complete_checkpoint(tmp_path, caplog) -> None:
    run = RunDir(tmp_path)
    model, optimizer = _trained()
    first = run.save_checkpoint(1, model, optimizer, {})
    second = run.save_checkpoint(2, model, optimizer, {})
    with open(second / "optimizer.pt", "r+b") as fh:  # torn: the tail never reached the disk
        fh.truncate(os.path.getsize(second / "optimizer.pt") // 2)
    assert run.latest_checkpoint() == first

    (second / "optimizer.pt").write_bytes(b"")  # a power loss's zero-length file
    assert run.latest_checkpoint() == first
    with pytest.raises(ValueError, match=r"optimizer\.pt"):
        RunDir.load_checkpoint(second, *_fresh())

    shutil.rmtree(second)  # `latest` names a folder that is gone
    assert run.latest_checkpoint() == first
    (tmp_path / "checkpoints" / "latest").write_text("")  # torn pointer: the folders are the truth
    assert run.latest_checkpoint() == first

    (first / "trainable.pt").write_bytes(b"")
    with caplog.at_level(logging.WARNING):
        assert run.latest_checkpoint() is None
    assert "none of the 1 step folders" in caplog.text


def test_a_complete_checkpoint_newer_than_latest_wins(tmp_path) -> None:
    """A kill between renaming the folder and replacing ``latest``."""
    run = RunDir(tmp_path)
    model, optimizer = _trained()
    run.save_checkpoint(1, model, optimizer, {})
    second = run.save_checkpoint(2, model, optimizer, {})
    (tmp_path / "checkpoints" / "latest").write_text("step-000001")
    assert run.latest_checkpoint() == second


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to name fsynced fds")
def test_every_checkpoint_file_and_directory_is_fsynced(tmp_path, monkeypatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    run = RunDir(tmp_path.resolve())  # /proc names the real path
    folder = run.save_checkpoint(3, *_trained(), {"phase": "rl"}, {"replay.jsonl": "{}\n"})
    staging = {Path(p).parent for p in synced if Path(p).name == "trainable.pt"}
    assert len(staging) == 1 and next(iter(staging)).name.startswith(".step-000003-")
    files_synced = {Path(p).name for p in synced if Path(p).parent in staging}
    assert files_synced == {p.name for p in folder.iterdir()}  # weights, optimizer, state, replay, manifest
    assert str(next(iter(staging))) in synced  # the staging folder's entries
    assert synced.count(str(folder.parent)) >= 2  # after the rename and after `latest`


def test_saving_removes_stale_staging_folders_only(tmp_path) -> None:
    run = RunDir(tmp_path)
    stale = tmp_path / "checkpoints" / ".step-000002-k1ll3d"
    stale.mkdir()
    (stale / "trainable.pt").write_bytes(b"half")
    kept = [tmp_path / "checkpoints" / ".keep-me", tmp_path / "checkpoints" / "notes"]
    for folder in kept:
        folder.mkdir()
    run.save_checkpoint(2, *_trained(), {})
    leftovers = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert leftovers == [".keep-me", "latest", "notes", "step-000002"]


def test_resaving_a_step_replaces_it_and_abandons_later_steps(tmp_path) -> None:
    """A run resumed from step 1 (say step 2 was torn, step 3 unknown to it) saves step 2
    again: a later resume must continue from the new step 2, not the stale step 3."""
    run = RunDir(tmp_path)
    model, optimizer = _trained()
    for step in (1, 2, 3):
        run.save_checkpoint(step, model, optimizer, {"phase": "bc"})
    folder = run.save_checkpoint(2, model, optimizer, {"phase": "rl"})
    assert run.latest_checkpoint() == folder
    assert RunDir.load_checkpoint(folder, *_fresh())["phase"] == "rl"
    assert sorted(p.name for p in folder.parent.iterdir()) == ["latest", "step-000001", "step-000002"]


def test_round_trip_restores_weights_adamw_and_every_rng(tmp_path) -> None:
    model, optimizer = _trained()
    folder = RunDir(tmp_path).save_checkpoint(5, model, optimizer, {"phase": "rl"}, {"r.jsonl": "x\n"})
    expected_python, expected_torch = random.random(), torch.rand(3)  # drawn after the save

    restored, restored_optimizer = _fresh()
    state = RunDir.load_checkpoint(folder, restored, restored_optimizer)
    assert state == {"step": 5, "phase": "rl"}
    assert torch.equal(restored.weight, model.weight) and torch.equal(restored.bias, model.bias)
    saved, loaded = optimizer.state_dict(), restored_optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    for index, moments in saved["state"].items():
        for key, value in moments.items():
            assert torch.equal(loaded["state"][index][key], value)
    assert random.random() == expected_python and torch.equal(torch.rand(3), expected_torch)


def test_a_crafted_pickle_is_refused_without_running(tmp_path) -> None:
    marker = tmp_path / "marker"
    _, optimizer = _trained()
    folder = tmp_path / "checkpoints" / "step-000001"
    payload = {"optimizer": optimizer.state_dict(), "rng": rng_state(), "note": _Payload(marker)}
    _write_format_1(folder, 1, payload)
    with pytest.raises(ValueError, match=r"refusing to load .*optimizer\.pt"):
        RunDir.load_checkpoint(folder, *_fresh())
    assert not marker.exists()


def test_a_format_1_run_folder_still_resumes(tmp_path) -> None:
    _, optimizer = _trained()
    folder = tmp_path / "checkpoints" / "step-000007"
    _write_format_1(folder, 7, {"optimizer": optimizer.state_dict(), "rng": rng_state()})
    (tmp_path / "checkpoints" / "latest").write_text("step-000007")
    expected = random.random()

    run = RunDir(tmp_path)
    assert run.latest_checkpoint() == folder
    model, restored_optimizer = _fresh()
    assert RunDir.load_checkpoint(folder, model, restored_optimizer) == {"step": 7, "phase": "rl"}
    assert restored_optimizer.state_dict()["state"][0]["step"] == 1
    assert random.random() == expected
    newer = run.save_checkpoint(8, model, restored_optimizer, {})  # and carries on in format 2
    assert run.latest_checkpoint() == newer and (newer / "manifest.json").exists()


def test_an_unknown_format_is_refused_naming_it(tmp_path) -> None:
    """A folder from a future agentgym: the legacy files plus a manifest of format 99."""
    _, optimizer = _trained()
    folder = tmp_path / "checkpoints" / "step-000001"
    _write_format_1(folder, 1, {"optimizer": optimizer.state_dict(), "rng": rng_state()})
    (folder / "manifest.json").write_text(json.dumps({"format": "agentgym-checkpoint/99", "files": {}}))
    with pytest.raises(ValueError, match=r"agentgym-checkpoint/99"):
        RunDir.load_checkpoint(folder, *_fresh())
    with pytest.raises(ValueError, match=r"agentgym-checkpoint/99"):
        RunDir(tmp_path).latest_checkpoint()  # not skipped: resuming older would then overwrite it

    foreign = tmp_path / "checkpoints" / "step-000002"
    foreign.mkdir()
    (foreign / "model.safetensors").write_bytes(b"\0")
    with pytest.raises(ValueError, match=r"unrecognised checkpoint format.*model\.safetensors"):
        RunDir.load_checkpoint(foreign, *_fresh())


def _steps(run: RunDir) -> list[int]:
    return sorted(int(p.name.removeprefix("step-")) for p in run.checkpoints.glob("step-*"))


def test_retention_keeps_the_newest_complete_checkpoints_and_the_best(tmp_path) -> None:
    run = RunDir(tmp_path)
    model, optimizer = _trained()
    held_out = {1: 0.2, 2: 0.9, 3: 0.1, 4: 0.3, 5: 0.0, 6: 0.0}
    for step, success in held_out.items():
        with open(run.metrics_path, "a") as fh:  # logged before the save, as the trainer does
            fh.write(json.dumps({"step": step, "val_success_rate": success}) + "\n")
        run.save_checkpoint(step, model, optimizer, {}, keep=2)
        if step == 4:  # step 4 is torn later (a bad disk): it must not count among the kept
            (run.checkpoints / "step-000004" / "trainable.pt").write_bytes(b"torn")
    assert _steps(run) == [2, 5, 6]  # the two newest complete ones and the best (step 2)
    assert run.best_step() == 2 and run.latest_checkpoint() == run.checkpoints / "step-000006"
    assert not list(run.checkpoints.glob(".step-*"))  # nothing half-deleted left behind


def test_retention_never_deletes_what_resume_falls_back_to(tmp_path) -> None:
    run = RunDir(tmp_path)
    model, optimizer = _trained()
    for step in (1, 2, 3):
        run.save_checkpoint(step, model, optimizer, {}, keep=1)
    assert _steps(run) == [3]  # no evaluation yet: no best to keep
    run.save_checkpoint(4, model, optimizer, {}, keep=0)
    (run.checkpoints / "step-000004" / "optimizer.pt").write_bytes(b"torn")
    run.prune(keep=1)
    assert _steps(run) == [3]  # the torn newest goes; step 3, the resume fallback, stays
    assert run.latest_checkpoint() == run.checkpoints / "step-000003"


def _train(*args: str) -> Result:
    return CliRunner().invoke(app, ["train", *args])


def _said(result: Result) -> str:
    return " ".join(result.output.split())  # rich wraps long lines


def _contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_resume_continues_the_folder_given_from_any_directory_even_moved(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second, third = (tmp_path / name for name in ("first", "second", "third"))
    for folder in (first, second, third):
        folder.mkdir()
    monkeypatch.chdir(first)
    settings = [f"--set={k}={json.dumps(v)}" for k, v in (TINY_RUN | {"env_url": choice_url}).items()]
    started = _train("--model", str(tiny_model_dir), "--out", "runs/a", *settings)
    assert started.exit_code == 0, started.output
    run = first / "runs" / "a"  # its config.yaml says output_dir: runs/a, relative to `first`
    logged = (run / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in logged] == [0, 1, 2]

    # Killed before step 2's checkpoint, resumed from another directory by a relative path.
    shutil.rmtree(run / "checkpoints" / "step-000002")
    monkeypatch.chdir(second)
    resumed = _train("--resume", "--out", "../first/runs/a")
    assert resumed.exit_code == 0, resumed.output
    assert list(second.iterdir()) == []  # nothing written where the command ran
    lines = (run / "metrics.jsonl").read_text().splitlines()
    assert lines[:2] == logged[:2] and [json.loads(line)["step"] for line in lines] == [0, 1, 2]
    assert RunDir(run).latest_checkpoint() == run / "checkpoints" / "step-000002"

    # Moved, step 2's checkpoint torn, resumed from a third directory: from step 1, in place.
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    (moved / "checkpoints" / "step-000002" / "trainable.pt").write_bytes(b"torn")
    monkeypatch.chdir(third)
    again = _train("--resume", "--out", str(moved))
    assert again.exit_code == 0, again.output
    assert list(third.iterdir()) == [] and list((first / "runs").iterdir()) == []
    lines = (moved / "metrics.jsonl").read_text().splitlines()
    assert lines[:2] == logged[:2] and [json.loads(line)["step"] for line in lines] == [0, 1, 2]
    assert RunDir(moved).latest_checkpoint() == moved / "checkpoints" / "step-000002"


@pytest.mark.parametrize("damage", ["every checkpoint torn", "steps logged, no checkpoint"])
def test_a_resume_that_would_start_over_is_refused_changing_nothing(
    damage: str, tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    run = RunDir(tmp_path)
    config = TrainConfig(**TINY_RUN, model=str(tiny_model_dir), env_url=choice_url, output_dir=str(tmp_path))
    config.save(tmp_path / "config.yaml")
    model, optimizer = _trained()
    for step in (1, 2):
        with open(run.metrics_path, "a") as fh:
            fh.write(json.dumps({"step": step, "phase": "rl", "success_rate": 0.5}) + "\n")
        run.save_checkpoint(step, model, optimizer, {"phase": "rl"})
    with open(run.metrics_path, "a") as fh:
        fh.write('{"step": 3, "pha')  # torn by the crash: a resume would drop it
    for folder in run.checkpoints.glob("step-*"):
        if damage == "every checkpoint torn":
            (folder / "optimizer.pt").write_bytes(b"")
        else:
            shutil.rmtree(folder)
    before = _contents(tmp_path)

    result = _train("--resume", "--out", str(tmp_path))
    assert result.exit_code == 2, result.output
    said = _said(result)
    assert f"cannot resume {tmp_path}" in said and "start over at step 1" in said
    assert "another --out" in said and "Traceback" not in said
    if damage == "every checkpoint torn":
        assert "none of its 2 checkpoints is complete (step-000001: optimizer.pt" in said
    else:
        assert "metrics.jsonl logs steps up to 2 but it has no checkpoint" in said
    assert _contents(tmp_path) == before  # metrics.jsonl, config.yaml, checkpoints: byte for byte


@pytest.mark.parametrize("folder", ["missing", "empty"])
def test_resuming_a_folder_without_a_run_is_refused(folder: str, tmp_path: Path) -> None:
    out = tmp_path / folder
    if folder == "empty":
        out.mkdir()
    result = _train("--resume", "--out", str(out))
    assert result.exit_code == 2, result.output
    said = _said(result)
    expected = "does not exist: nothing to resume" if folder == "missing" else "holds no run to resume"
    assert f"{out} {expected}" in said, said
    assert out.exists() == (folder == "empty") and not list(tmp_path.rglob("*.yaml"))


def test_a_run_folder_is_readable_by_others(tmp_path: Path) -> None:
    """Checkpoints, the metrics log cut back on resume and the play record: not private
    (temporary files and folders start as 0600 / 0700)."""
    run = RunDir(tmp_path / "run")
    model, optimizer = _trained()
    folder = run.save_checkpoint(1, model, optimizer, {})
    log = MetricsLog(run.metrics_path)
    log.log({"step": 1})
    log.log({"step": 2})
    log.close()
    MetricsLog(run.metrics_path, resume_step=1).close()  # cut back: rewritten whole
    write_play(run.path, PlayProfile())
    modes = {
        p.name: p.stat().st_mode & 0o777
        for p in [folder, *folder.iterdir(), run.metrics_path, run.path / PLAY_FILE]
    }
    assert modes[folder.name] == 0o755 and all(
        mode == 0o644 for name, mode in modes.items() if name != folder.name
    ), modes
