"""The run-folder format: resolved config, metrics log, checkpoints and the curves' panels,
all crash-safe. The trainer writes it; policies, ``export``, the viewer and ``eval --model``
read it, so it sits below all of them and imports none.

A checkpoint is written to a ``.step-*`` staging folder (each file fsynced, then
``manifest.json`` with every file's size and sha256, last), renamed to ``step-NNNNNN``
and the directory fsynced before ``latest`` is replaced. After a ``kill -9`` or a power
loss, ``latest_checkpoint`` returns the newest folder whose manifest matches its files
(``latest`` is a hint); the next save deletes leftover staging folders and the step
folders after its own (an abandoned run's). Files load with
``torch.load(weights_only=True)``, so a run folder cannot run code; folders from before the
manifest (format 1) still load. Resuming truncates the metrics log to the checkpoint's
step, so the log never holds a step twice or misses one. A folder with trained steps but no
complete checkpoint is refused (:meth:`RunDir.resume_checkpoint`), changing nothing in it:
resuming it would start over at step 1.

Retention: each save keeps the ``keep`` newest *complete* checkpoints (a torn folder never
counts, so the one resume would fall back to is always among them) plus the best by
validation success (``val_success_rate`` in ``metrics.jsonl``; never the test panel's
``eval_success_rate``, which only the final report reads); the rest are renamed to a
staging name, then deleted (a crash in between leaves them to the next save's cleanup).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # torch loads only where a checkpoint is read or written: the viewer never pays it
    import torch

CHECKPOINTS = "checkpoints"
MANIFEST = "manifest.json"
FORMAT = "agentgym-checkpoint/2"  # in each manifest; format 1 is the manifest-less layout before it
LEGACY_FILES = ("trainable.pt", "optimizer.pt", "state.json")
STEP_PREFIX = "step-"
BEST_BY = "val_success_rate"
PLAY_FILE = "play.json"
"""How a run (or an exported model) is played, :class:`agentgym.play.play_profile.PlayProfile`'s
record: written by the trainer, copied by ``export``, read by ``eval --model`` so a trained
model is played as it was trained, and by the model's loader for the dtype it trained in."""
"""The metric the best checkpoint is chosen by: validation success, never the test panel's."""
log = logging.getLogger(__name__)


def _fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in ``path`` durable (a file's fsync does not cover it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, write: Callable[[IO[bytes]], Any]) -> dict[str, Any]:
    """Write ``path`` with ``write``, fsync it, return its manifest entry (size, sha256)."""
    with open(path, "wb") as fh:
        write(fh)
        fh.flush()
        os.fsync(fh.fileno())
    return {"size": path.stat().st_size, "sha256": _sha256(path)}


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


READABLE_FILE, READABLE_FOLDER = 0o644, 0o755
"""A run folder is shared (a viewer, a colleague, an upload): temporary files and folders
are created private (0600, 0700), so they are opened up before they take their names."""


def atomic_write_text(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as tmp:
        tmp.write(text)
        tmp.flush()
        os.fsync(tmp.fileno())
    os.chmod(tmp.name, READABLE_FILE)
    os.replace(tmp.name, path)
    _fsync_dir(path.parent)


def _safe_load(path: Path) -> Any:
    """Tensors and plain data only: a pickle building other objects could run code."""
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).splitlines()[0]
        raise ValueError(f"refusing to load {path}: not only tensors and plain data ({reason})") from error
    except Exception as error:  # torn or foreign files fail in many ways (EOF, zip, index)
        raise ValueError(f"cannot read {path}: {type(error).__name__}: {error}") from error


def rng_state() -> dict[str, Any]:
    import torch

    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_problem(folder: Path) -> str | None:
    """Why ``folder`` is not a complete checkpoint (missing, torn), or None. A manifest of
    another format raises ValueError: skipping it would resume from an older step and
    then overwrite the newer folders."""
    if not folder.is_dir():
        return "not a folder"
    if not (folder / MANIFEST).exists():
        return _legacy_problem(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        found = manifest.get("format")
    except (ValueError, AttributeError):
        return f"unreadable {MANIFEST}"
    if found != FORMAT:
        raise ValueError(
            f"checkpoint {folder} has format {found!r}; this agentgym reads {FORMAT!r} and format 1"
        )
    try:
        files = {name: (int(e["size"]), str(e["sha256"])) for name, e in manifest["files"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return f"{MANIFEST} has no valid file list"
    if unlisted := set(LEGACY_FILES) - set(files):
        return f"{MANIFEST} does not list {sorted(unlisted)}"
    for name, (size, sha256) in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size or _sha256(path) != sha256:
            return f"{name} does not match {MANIFEST} (torn or modified)"
    return None


def _legacy_problem(folder: Path) -> str | None:
    """Format 1 (no manifest): the three files, non-empty, and a ``state.json`` with a step."""
    found = sorted(p.name for p in folder.iterdir())
    if not set(LEGACY_FILES) <= set(found):
        return f"unrecognised checkpoint format: no {MANIFEST}, files {found}"
    try:
        step = json.loads((folder / "state.json").read_text())["step"]
    except (ValueError, KeyError, TypeError):
        step = None
    if not isinstance(step, int) or any((folder / n).stat().st_size == 0 for n in LEGACY_FILES):
        return "torn format 1 checkpoint (an empty file, or no step in state.json)"
    return None


class RunDir:
    """A run folder. ``create=False`` only reads one (no folder is made: ``eval`` and
    ``export`` open runs that way)."""

    def __init__(self, path: str | Path, *, create: bool = True) -> None:
        self.path = Path(path)
        self.checkpoints = self.path / CHECKPOINTS
        if create:
            self.checkpoints.mkdir(parents=True, exist_ok=True)

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint, whatever ``latest`` says (a crash can leave it
        naming a torn or missing folder, or one step behind); None if there is none. Raises
        ValueError on a checkpoint of another format rather than resume from before it."""
        folder, skipped = self._newest_complete()
        self._warn_skipped(skipped)
        if folder is None and skipped:
            log.warning("none of the %d step folders in %s is complete", len(skipped), self.checkpoints)
        return folder

    def _newest_complete(self) -> tuple[Path | None, list[tuple[Path, str]]]:
        """The newest complete checkpoint (or None) and the newer folders skipped, with why."""
        skipped = []
        for folder, _ in sorted(self._step_folders().items(), key=lambda item: -item[1]):
            problem = checkpoint_problem(folder)
            if problem is None:
                return folder, skipped
            skipped.append((folder, problem))
        return None, skipped

    @staticmethod
    def _warn_skipped(skipped: list[tuple[Path, str]]) -> None:
        for folder, problem in skipped:
            log.warning("skipping checkpoint %s: %s", folder, problem)

    def resume_checkpoint(self) -> Path | None:
        """Where a resume continues: the newest complete checkpoint, or None for a run that
        has trained no step yet (it starts at step 1, keeping a step-0 evaluation it logged).
        Reads only. ValueError, saying what was found and what to do, when steps were trained
        but no complete checkpoint holds them (every step folder torn, or steps logged before
        the first save): resuming would start over at step 1, cut ``metrics.jsonl`` back and
        delete the torn folders."""
        folder, skipped = self._newest_complete()
        if folder is not None:
            self._warn_skipped(skipped)
            return folder
        logged = [
            step
            for record in MetricsLog(self.metrics_path).read()
            if isinstance(step := record.get("step"), int) and step > 0
        ]
        if not skipped and not logged:
            return None
        if skipped:
            found = "; ".join(f"{f.name}: {problem}" for f, problem in reversed(skipped))
            what = f"none of its {len(skipped)} checkpoints is complete ({found})"
        else:
            what = f"{self.metrics_path.name} logs steps up to {max(logged)} but it has no checkpoint"
        raise ValueError(
            f"cannot resume {self.path}: {what}. Resuming would start over at step 1 and cut "
            f"{self.metrics_path.name} back, so nothing was changed. Start a new run with another "
            f"--out, or delete {self.path} and run again without --resume."
        )

    def checkpoint_at(self, step: int) -> Path:
        """The complete checkpoint of ``step``; ValueError naming the steps there are otherwise."""
        folder = self.checkpoints / f"{STEP_PREFIX}{step:06d}"
        if not folder.is_dir():
            steps = sorted(self._step_folders().values())
            raise ValueError(f"{self.path} has no checkpoint of step {step}; it has steps {steps}")
        if problem := checkpoint_problem(folder):
            raise ValueError(f"checkpoint {folder} is not complete: {problem}")
        return folder

    def best_step(self) -> int | None:
        """The step with the highest validation success (:data:`BEST_BY`) that still has a
        checkpoint folder; the later one on a tie. None before any validation."""
        saved = set(self._step_folders().values())
        scored = [
            (record[BEST_BY], record["step"])
            for record in MetricsLog(self.metrics_path).read()
            if isinstance(record.get(BEST_BY), int | float) and record.get("step") in saved
        ]
        return max(scored)[1] if scored else None

    def _step_folders(self) -> dict[Path, int]:
        found = {p: p.name.removeprefix(STEP_PREFIX) for p in self.checkpoints.glob(f"{STEP_PREFIX}*")}
        return {p: int(n) for p, n in found.items() if n.isdigit() and p.is_dir()}

    def prune(self, keep: int) -> list[Path]:
        """Delete all checkpoints but the ``keep`` newest complete ones and the best
        (:meth:`best_step`); ``keep=0`` keeps every one. Returns the deleted folders."""
        if keep < 0:
            raise ValueError(f"keep must be at least 0, got {keep}")
        if keep == 0:
            return []
        best, kept, doomed = self.best_step(), 0, []
        for folder, step in sorted(self._step_folders().items(), key=lambda item: -item[1]):
            if kept < keep and checkpoint_problem(folder) is None:
                kept += 1
            elif step != best:
                doomed.append(folder)
        for folder in doomed:
            # Renamed first: a crash mid-delete leaves a staging name that the next save
            # cleans up, never a half-deleted step folder that looks like a checkpoint.
            trash = self.checkpoints / f".{folder.name}-pruned"
            os.replace(folder, trash)
            shutil.rmtree(trash, ignore_errors=True)
        if doomed:
            _fsync_dir(self.checkpoints)
        return doomed

    def _remove_leftovers(self, step: int) -> None:
        """Delete the ``.step-*`` staging folders of killed saves, and step folders after
        ``step``: a run saving ``step`` resumed from before them, and ``latest_checkpoint``
        (which trusts folders over ``latest``) must not resume from an abandoned future."""
        abandoned = [p for p, n in self._step_folders().items() if n > step]
        for leftover in [*self.checkpoints.glob(f".{STEP_PREFIX}*"), *abandoned]:
            if leftover.is_dir():
                log.info("removing %s (left by an interrupted or abandoned run)", leftover)
                shutil.rmtree(leftover, ignore_errors=True)

    def save_checkpoint(
        self,
        step: int,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        state: dict[str, Any],
        files: dict[str, str] | None = None,
        keep: int = 0,
    ) -> Path:
        """Save trainable weights, optimizer, RNG, ``state`` (JSON-able) and ``files``
        (name: text, e.g. the replay buffer) for ``step``, then :meth:`prune` to ``keep``
        (0: keep all). Only one process may save into a run folder: this removes the
        staging folders of killed saves and any step folders after ``step``."""
        import torch

        files = files or {}
        reserved = {*LEGACY_FILES, MANIFEST}
        if bad := [n for n in files if n in reserved or Path(n).name != n or n.startswith(".")]:
            raise ValueError(f"checkpoint file names must be plain and not {sorted(reserved)}: {bad}")
        self._remove_leftovers(step)
        name = f"{STEP_PREFIX}{step:06d}"
        staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=self.checkpoints))
        trainable = {k: v.detach().cpu() for k, v in model.named_parameters() if v.requires_grad}
        saved = {"optimizer": optimizer.state_dict(), "rng": rng_state()}
        texts = {"state.json": json.dumps({"step": step, **state}, indent=2), **files}
        writers: dict[str, Callable[[IO[bytes]], Any]] = {
            "trainable.pt": lambda fh: torch.save(trainable, fh),
            "optimizer.pt": lambda fh: torch.save(saved, fh),
            **{n: (lambda fh, t=text: fh.write(t.encode())) for n, text in texts.items()},
        }
        manifest = {n: _write_durably(staging / n, write) for n, write in writers.items()}
        # The manifest goes last: a folder whose manifest matches its files is complete.
        record = json.dumps({"format": FORMAT, "files": manifest}, indent=2).encode()
        _write_durably(staging / MANIFEST, lambda fh: fh.write(record))
        staging.chmod(READABLE_FOLDER)
        _fsync_dir(staging)
        final = self._publish(staging, name)
        self.prune(keep)
        return final

    def _publish(self, staging: Path, name: str) -> Path:
        """Rename ``staging`` to ``name`` (an older folder of that name is moved aside under
        a staging name first, so a crash here leaves it to cleanup), then point ``latest``."""
        final = self.checkpoints / name
        replaced = self.checkpoints / f".{name}-replaced"
        if final.exists():
            os.replace(final, replaced)
        os.replace(staging, final)
        _fsync_dir(self.checkpoints)
        atomic_write_text(self.checkpoints / "latest", name)
        shutil.rmtree(replaced, ignore_errors=True)
        return final

    @staticmethod
    def load_checkpoint(
        folder: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
    ) -> dict[str, Any]:
        """Restore weights, optimizer and RNG from ``folder``; return its state (with ``step``).
        Raises ValueError for a torn, unknown-format or unsafe checkpoint."""
        folder = Path(folder)
        trainable = load_trainable(folder)
        missing = set(trainable) - {k for k, v in model.named_parameters() if v.requires_grad}
        if missing:
            raise ValueError(f"checkpoint {folder} does not match the model: unknown {sorted(missing)[:3]}")
        saved = _safe_load(folder / "optimizer.pt")
        model.load_state_dict(trainable, strict=False)
        optimizer.load_state_dict(saved["optimizer"])
        set_rng_state(saved["rng"])
        return json.loads((folder / "state.json").read_text())


def load_trainable(folder: Path) -> dict[str, torch.Tensor]:
    """The trained weights of a complete checkpoint (LoRA adapters, or every weight when a
    run trained all of them), by parameter name; ValueError for a torn or unsafe one."""
    if problem := checkpoint_problem(folder):
        raise ValueError(f"cannot load checkpoint {folder}: {problem}")
    return _safe_load(folder / "trainable.pt")


class MetricsLog:
    """Append-only JSONL, one record per line, flushed and fsynced as written; every
    numeric field also goes to each of ``sinks`` (TensorBoard, W&B: :mod:`agentgym.trainers.reporting`)."""

    def __init__(self, path: Path, resume_step: int | None = None, sinks: Sequence[MetricSink] = ()) -> None:
        self.path = path
        if resume_step is not None and path.exists():
            self._truncate_after(resume_step)
        self.sinks = list(sinks)

    def _lines(self) -> list[tuple[str, dict[str, Any]]]:
        """Each line with its record; a torn line (a crash mid-write) is skipped."""
        parsed = []
        for line in self.path.read_text().splitlines() if self.path.exists() else []:
            try:
                parsed.append((line, json.loads(line)))
            except json.JSONDecodeError:
                continue
        return parsed

    def _truncate_after(self, step: int) -> None:
        """Keep the records up to ``step`` (a torn last line from a crash is dropped)."""
        kept = [line for line, record in self._lines() if record.get("step", 0) <= step]
        atomic_write_text(self.path, "".join(f"{line}\n" for line in kept))

    def log(self, record: dict[str, Any]) -> None:
        with open(self.path, "a") as fh:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        for sink in self.sinks:
            sink.log(record["step"], numeric(record))

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()

    def read(self) -> list[dict[str, Any]]:
        return [record for _, record in self._lines()]


# ----- metrics records (their curves: agentgym/records/curves.py) -----------------------------


class MetricSink(Protocol):
    def log(self, step: int, values: dict[str, float]) -> None:
        """Record ``values`` (numeric fields only) at ``step``."""
        ...

    def close(self) -> None: ...


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a metrics record, ``step`` aside (booleans and strings stay in
    the JSONL only)."""
    return {
        key: value
        for key, value in record.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and key != "step"
    }


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when the file is missing, unreadable or not an object."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
