"""Trajectories as a table: Parquet, or a Hugging Face ``datasets`` dataset.

``agentgym export-trajectories PATH --format parquet|hf --out DIR`` reads a trajectory JSONL
file (``collect``'s output, an eval's ``trajectories.jsonl``) or every trajectory file under a
folder (an eval folder, a training run's ``rollouts/step-N.jsonl``) and writes one row per
episode: every field of :class:`~agentgym.records.trajectory.Trajectory` with one fixed Arrow schema
(so exports of different runs concatenate), plus ``source`` (the file, relative to
``PATH``) and ``step`` (the training step of a rollout file, else null).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agentgym.records.trajectory import Trajectory, read_trajectories, step_of, trajectory_files

FORMATS = ("parquet", "hf")
PARQUET_FILE = "trajectories.parquet"
"""The file ``--format parquet`` writes in ``--out``."""
TIMINGS = frozenset({"generation", "env", "total"})
"""Always columns of ``timings`` (Parquet cannot store a struct without fields)."""
INSTALL = "pip install 'agentgym-platform[datasets]'"


def arrow_schema(timing_keys: list[str]) -> Any:
    """The table's schema; ``timings`` is a struct of the keys the records use."""
    import pyarrow as pa

    message = pa.struct(
        [
            ("role", pa.string()),
            ("content", pa.string()),
            ("loss", pa.bool_()),
            # Set on replies the policy made through an OpenAI tool call (--tool-calls).
            ("tool_call", pa.struct([("name", pa.string()), ("arguments", pa.string())])),
        ]
    )
    fields = {
        "env": pa.string(),
        "task_id": pa.string(),
        "policy": pa.string(),
        "messages": pa.list_(message),
        "sample": pa.int64(),
        "split": pa.string(),
        "seed": pa.int64(),
        "format": pa.string(),
        "token_ids": pa.list_(pa.int64()),
        "loss_mask": pa.list_(pa.int8()),
        "logprobs": pa.list_(pa.float64()),
        "versions": pa.list_(pa.int64()),
        "reply_choices": pa.list_(pa.list_(pa.list_(pa.int64()))),
        "rewards": pa.list_(pa.float64()),
        "actions": pa.list_(pa.string()),
        "score": pa.float64(),
        "shaped_score": pa.float64(),
        "success": pa.bool_(),
        "turns": pa.int64(),
        "invalid_turns": pa.int64(),
        "end_reason": pa.string(),
        "error": pa.string(),
        "template_drift": pa.bool_(),
        "generated_tokens": pa.int64(),
        "timings": pa.struct([(key, pa.float64()) for key in timing_keys]),
        "schema_version": pa.int64(),
        "source": pa.string(),
        "step": pa.int64(),
    }
    return pa.schema(list(fields.items()))


def rows(path: Path) -> Iterator[dict[str, Any]]:
    """One dict per episode of every trajectory file at ``path`` (records of older schema
    versions read with today's defaults); ValueError when there is none."""
    files = trajectory_files(path)
    if not files:
        raise ValueError(f"{path} holds no trajectory JSONL (a collect/eval output, or a run folder)")
    for file in files:
        source = str(file.relative_to(path)) if path.is_dir() else file.name
        for trajectory in read_trajectories(file):
            yield {**_flat(trajectory), "source": source, "step": step_of(file)}


def _flat(trajectory: Trajectory) -> dict[str, Any]:
    record = trajectory.to_dict()
    record["messages"] = [{**m, "tool_call": m.get("tool_call")} for m in record["messages"]]
    return record


def to_table(path: Path) -> Any:
    """The episodes at ``path`` as a ``pyarrow.Table``."""
    import pyarrow as pa

    episodes = list(rows(path))
    timing_keys = sorted(TIMINGS.union(*(row["timings"] for row in episodes)))
    return pa.Table.from_pylist(episodes, schema=arrow_schema(timing_keys))


def export_trajectories(path: str | Path, out: str | Path, output_format: str = "parquet") -> Path:
    """Write the episodes at ``path`` to the folder ``out``: ``parquet`` writes
    ``out/trajectories.parquet``; ``hf`` a ``datasets`` dataset (``datasets.load_from_disk``).
    Returns what was written. ValueError for an unknown format or nothing to export."""
    if output_format not in FORMATS:
        raise ValueError(f"unknown format {output_format!r}; choose one of {', '.join(FORMATS)}")
    try:
        import pyarrow.parquet as pq

        if output_format == "hf":
            from datasets import Dataset
    except ImportError as exc:
        raise ValueError(f"exporting trajectories needs {exc.name}: {INSTALL}") from None
    table = to_table(Path(path))
    out = Path(out)
    if output_format == "hf":
        Dataset(table).save_to_disk(str(out))
        return out

    out.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, out / PARQUET_FILE)
    return out / PARQUET_FILE
