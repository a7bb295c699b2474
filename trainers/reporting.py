"""Where a run's metrics go besides ``metrics.jsonl``: TensorBoard, Weights & Biases.

``report_to`` (``agentgym train --report-to``) names the sinks; each gets every numeric
field of every step's record, at that step. W&B works offline: with ``WANDB_MODE=offline``
it writes a local run under ``RUN_DIR/wandb/`` that ``wandb sync`` uploads later. The W&B
run id is kept in ``RUN_DIR/wandb-id``, so ``--resume`` continues the same W&B run.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.records.run_folder import MetricSink

REPORTERS = ("tensorboard", "wandb")
WANDB_ID_FILE = "wandb-id"


def reporter_problems(report_to: Sequence[str]) -> list[str]:
    """A sentence per unknown name in ``report_to`` (for the config checks)."""
    unknown = [name for name in report_to if name not in REPORTERS]
    return [f"report_to: unknown {', '.join(unknown)}; choose from {', '.join(REPORTERS)}"] if unknown else []


class TensorBoardSink:
    """Scalars under ``folder`` (``tensorboard --logdir``)."""

    def __init__(self, folder: Path, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step drops events a killed run wrote past the checkpoint, as for the JSONL.
        self.writer = SummaryWriter(str(folder), purge_step=(resume_step or 0) + 1)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A W&B run named after the run folder, its config the run's resolved config."""

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str) -> None:
        try:
            import wandb
        except ImportError:
            raise ValueError(
                "--report-to wandb needs the wandb package: pip install 'agentgym-platform[wandb]'"
            ) from None
        id_file = run_dir / WANDB_ID_FILE
        if not id_file.exists():
            id_file.write_text(uuid.uuid4().hex[:12])  # W&B ids: letters and digits
        self.run = wandb.init(
            project=project,
            name=run_dir.name,
            id=id_file.read_text().strip(),
            resume="allow",
            dir=str(run_dir),
            config=config,
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


def open_sinks(
    report_to: Sequence[str], run_dir: Path, config: dict[str, Any], project: str, resume_step: int | None
) -> list[MetricSink]:
    """The sinks ``report_to`` names, opened for the run in ``run_dir``."""
    sinks: list[MetricSink] = []
    for name in report_to:
        if name == "tensorboard":
            sinks.append(TensorBoardSink(run_dir / "tensorboard", resume_step))
        elif name == "wandb":
            sinks.append(WandbSink(run_dir, config, project))
    return sinks
