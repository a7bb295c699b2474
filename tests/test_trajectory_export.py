"""Issue 21 item 7: trajectories from ``collect``, ``eval`` and training runs exported as
Parquet and as a Hugging Face ``datasets`` dataset (``agentgym export-trajectories``), read
back with ``datasets`` and ``pyarrow`` exactly as written; on a real choice server."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.records.trajectory import Trajectory, read_jsonl, write_trajectories

datasets = pytest.importorskip("datasets")
runner = CliRunner()


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def same_episodes(rows: list[dict], records: list[dict]) -> None:
    """Rows hold every record's fields with their values (messages, actions, outcome...)."""
    assert len(rows) == len(records) > 0
    for row, record in zip(rows, records, strict=True):
        for key in ("env", "task_id", "policy", "actions", "rewards", "success", "turns", "end_reason"):
            assert row[key] == record[key], key
        assert [(m["role"], m["content"], m["loss"]) for m in row["messages"]] == [
            (m["role"], m["content"], m["loss"]) for m in record["messages"]
        ]
        assert row["schema_version"] == record["schema_version"]


def test_collect_output_exports_to_parquet_that_datasets_loads(choice_url: str, tmp_path: Path) -> None:
    collected = tmp_path / "expert.jsonl"
    invoke("collect", "--env", "choice", "--url", choice_url, "--n", "5", "--out", str(collected))
    invoke("export-trajectories", str(collected), "--format", "parquet", "--out", str(tmp_path / "pq"))
    parquet = tmp_path / "pq" / "trajectories.parquet"
    loaded = datasets.load_dataset("parquet", data_files=str(parquet), split="train")
    records = list(read_jsonl(collected))
    same_episodes(list(loaded), records)
    assert set(loaded["source"]) == {"expert.jsonl"} and set(loaded["step"]) == {None}
    assert all(loaded["success"])


def test_an_eval_folder_exports_as_a_datasets_dataset(choice_url: str, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    invoke(
        "eval", "--env", "choice", "--policy", "expert", "--url", choice_url, "--n", "4", "--out", str(out)
    )
    invoke("export-trajectories", str(out), "--format", "hf", "--out", str(tmp_path / "ds"))
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    same_episodes(list(loaded), list(read_jsonl(out / "trajectories.jsonl")))
    assert set(loaded["source"]) == {"trajectories.jsonl"}
    assert loaded.features["timings"]["total"].dtype == "float64"


def token_episode(i: int) -> Trajectory:
    messages = [
        {"role": "system", "content": "s", "loss": False},
        {"role": "user", "content": "o", "loss": False},
        {"role": "assistant", "content": "Action: a", "loss": True},
        {"role": "user", "content": "done", "loss": False},
    ]
    return Trajectory(
        env="choice",
        task_id=f"t{i}",
        policy="tiny",
        messages=messages,
        token_ids=[1, 2, 3, 4 + i],
        loss_mask=[0, 0, 1, 1],
        logprobs=[0.0, 0.0, -0.5, -1.25],
        versions=[-1, -1, i, i],
        rewards=[1.0],
        actions=["a"],
        success=True,
        turns=1,
        timings={"total": 0.5, "queue": 0.25},
    )


def test_a_run_folder_exports_every_step_with_its_tokens(tmp_path: Path) -> None:
    run = tmp_path / "run"
    for step in (10, 2):  # numeric order, not file-name order
        write_trajectories(run / "rollouts" / f"step-{step:06d}.jsonl", [token_episode(step)])
    (run / "metrics.jsonl").write_text(json.dumps({"step": 2, "loss": 0.1}) + "\n")
    invoke("export-trajectories", str(run), "--out", str(tmp_path / "pq"))
    table = pq.read_table(tmp_path / "pq" / "trajectories.parquet")
    rows = table.to_pylist()
    assert [r["step"] for r in rows] == [2, 10]
    assert [r["source"] for r in rows] == ["rollouts/step-000002.jsonl", "rollouts/step-000010.jsonl"]
    assert rows[1]["token_ids"] == [1, 2, 3, 14] and rows[1]["loss_mask"] == [0, 0, 1, 1]
    assert rows[1]["logprobs"] == [0.0, 0.0, -0.5, -1.25] and rows[1]["versions"] == [-1, -1, 10, 10]
    assert rows[0]["timings"] == {"env": None, "generation": None, "queue": 0.25, "total": 0.5}


def test_nothing_to_export_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    for args, message in ((), "holds no trajectory JSONL"), (("--format", "csv"), "unknown format 'csv'"):
        result = runner.invoke(
            app, ["export-trajectories", str(tmp_path), "--out", str(tmp_path / "x"), *args]
        )
        assert result.exit_code == 2 and message in " ".join(result.output.split())
