"""A run folder: resolved config, metrics log and checkpoints, all crash-safe.

Checkpoints are written to a temporary folder and renamed into place, then ``latest``
is replaced atomically, so a ``kill -9`` at any moment leaves the previous checkpoint
intact. Resuming truncates the metrics log to the checkpoint's step, so the log never
holds a step twice or misses one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

CHECKPOINTS = "checkpoints"


def _atomic_write_text(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
        tmp.flush()
        os.fsync(tmp.fileno())
    os.replace(tmp.name, path)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class RunDir:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        (self.path / CHECKPOINTS).mkdir(parents=True, exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def latest_checkpoint(self) -> Path | None:
        pointer = self.path / CHECKPOINTS / "latest"
        if not pointer.exists():
            return None
        folder = self.path / CHECKPOINTS / pointer.read_text().strip()
        return folder if folder.is_dir() else None

    def save_checkpoint(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        files: dict[str, str] | None = None,
    ) -> Path:
        """Save trainable weights, optimizer, RNG, ``state`` (JSON-able) and ``files``
        (name: text, e.g. the replay buffer) for ``step``."""
        name = f"step-{step:06d}"
        final = self.path / CHECKPOINTS / name
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.path / CHECKPOINTS))
        trainable = {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}
        torch.save(trainable, staging / "trainable.pt")
        torch.save({"optimizer": optimizer.state_dict(), "rng": rng_state()}, staging / "optimizer.pt")
        (staging / "state.json").write_text(json.dumps({"step": step, **state}, indent=2))
        for filename, text in (files or {}).items():
            (staging / filename).write_text(text)
        if final.exists():
            shutil.rmtree(final)
        os.replace(staging, final)
        _atomic_write_text(self.path / CHECKPOINTS / "latest", name)
        return final

    @staticmethod
    def load_checkpoint(
        folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Restore weights, optimizer and RNG from ``folder``; return its state (with ``step``)."""
        trainable = torch.load(folder / "trainable.pt", weights_only=True)
        missing = set(trainable) - {k for k, v in model.named_parameters() if v.requires_grad}
        if missing:
            raise ValueError(f"checkpoint {folder} does not match the model: unknown {sorted(missing)[:3]}")
        model.load_state_dict(trainable, strict=False)
        saved = torch.load(folder / "optimizer.pt", weights_only=False)
        optimizer.load_state_dict(saved["optimizer"])
        set_rng_state(saved["rng"])
        return json.loads((folder / "state.json").read_text())


class MetricsLog:
    """Append-only JSONL, one record per line, flushed and fsynced as written; with
    ``tensorboard_dir``, every numeric field also goes to TensorBoard under its name."""

    def __init__(
        self, path: Path, resume_step: int | None = None, tensorboard_dir: Path | None = None
    ) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            self._truncate_after(resume_step)
        self._tensorboard = None
        if tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            # purge_step drops events a killed run wrote past the checkpoint, as for the JSONL.
            self._tensorboard = SummaryWriter(str(tensorboard_dir), purge_step=(resume_step or 0) + 1)

    def _truncate_after(self, step: int) -> None:
        """Keep the records up to ``step`` (a torn last line from a crash is dropped)."""
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if record.get("step", 0) <= step:
                kept.append(line)
        _atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if self._tensorboard is not None:
            for key, value in record.items():
                if isinstance(value, int | float) and not isinstance(value, bool) and key != "step":
                    self._tensorboard.add_scalar(key, value, record["step"])
            self._tensorboard.flush()

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return records
