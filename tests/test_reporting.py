"""Issue 21 item 7: ``agentgym train --report-to wandb`` logs every step's metrics to a
Weights & Biases run, offline (``WANDB_MODE=offline`` writes the run under the run folder);
read back from W&B's own run file. ``--report-to none`` writes no TensorBoard events, and an
unknown reporter is refused before anything starts."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest
from test_trainer_recipes import TINY
from typer.testing import CliRunner

from agentgym.cli import app
from conftest import run_metrics

wandb = pytest.importorskip("wandb")

SETTINGS = TINY | {"bc_steps": 1, "bc_episodes": 4}
"""One behaviour-cloning step, then one GRPO step."""


def train(out: Path, model: Path, url: str, *args: str) -> None:
    command = ["train", "--algo", "grpo", "--schedule", "fixed", "--model", str(model), "--out", str(out)]
    command += [
        f"--set={key}={value}" for key, value in (SETTINGS | {"env_url": url, "env": "choice"}).items()
    ]
    result = CliRunner().invoke(app, [*command, *args])
    assert result.exit_code == 0, result.output


def wandb_records(run_file: Path) -> list[Any]:
    """The protobuf records of a ``.wandb`` file: a 7-byte header, then LevelDB log blocks
    of 32 KiB whose chunks (7-byte header: crc, length, type) join into records."""
    from wandb.proto import wandb_internal_pb2

    data, position, chunk, records = run_file.read_bytes(), 7, b"", []
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if kind == 0:
            break
        chunk += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def test_train_reports_every_step_to_an_offline_wandb_run(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    train(run, tiny_model_dir, choice_url, "--report-to", "wandb", "--set=wandb_project=issue21")
    [run_file] = run.glob("wandb/offline-run-*/run-*.wandb")
    records = wandb_records(run_file)
    [started] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.project == "issue21" and started.display_name == "run"
    assert started.run_id == (run / "wandb-id").read_text().strip()
    config = {item.key: json.loads(item.value_json) for item in started.config.update}
    assert config["algo"] == "grpo" and config["report_to"] == ["wandb"]
    history = {
        r.history.step.num: {
            i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item
        }
        for r in records
        if r.WhichOneof("record_type") == "history"
    }
    metrics = run_metrics(run)
    assert sorted(history) == [m["step"] for m in metrics] == [1, 2]
    for row in metrics:  # every numeric field of every step, at that step
        numbers = {k: v for k, v in row.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        assert {k: history[row["step"]][k] for k in numbers if k != "step"} == pytest.approx(
            {k: v for k, v in numbers.items() if k != "step"}
        )
    assert "loss" in history[1] and {"loss", "success_rate"} <= set(history[2])
    assert not (run / "tensorboard").exists()  # --report-to replaces the default


def test_report_to_none_writes_no_tensorboard_events(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    train(tmp_path / "run", tiny_model_dir, choice_url, "--report-to", "none")
    assert not (tmp_path / "run" / "tensorboard").exists()
    assert len(run_metrics(tmp_path / "run")) == 2


def test_an_unknown_reporter_is_refused_before_anything_starts(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--report-to", "mlflow", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "report_to: unknown mlflow; choose from tensorboard, wandb" in " ".join(result.output.split())
    assert not (tmp_path / "run").exists()
