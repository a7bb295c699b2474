"""``manifest.json``: what a report's figures came from, written beside them.

The trainer writes one into the run folder beside ``heldout.json`` at the end of a run;
``bench/learning.py`` writes one beside its table. Fields (:data:`FIELDS`): the test task
ids, the seeds, the git commit of this code (None outside a git checkout), the model's
sha256, the generator, the torch, transformers and Python versions, the dtype trained
in, the machine (:func:`machine`: CPU and its vector units, cores, GPU), the config as the
trainer saves it, and the per-task outcomes of every held-out evaluation. Nothing here may fail a run: what cannot be found is None.

The model's sha256 is the one ``agentgym eval`` records in ``results.json``
(:meth:`agentgym.policies.models.ModelSource.describe`): over the names and sha256 of the
files of the model folder loaded (and of the checkpoint merged in, for a run), each file's
hash cached (:func:`agentgym.contract.cache.file_sha256`).
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from agentgym.policies.models import ModelSource

log = logging.getLogger(__name__)

MANIFEST_FILE = "manifest.json"
FIELDS = (
    "tasks",
    "seeds",
    "git_commit",
    "model_sha256",
    "generator",
    "torch",
    "transformers",
    "python",
    "dtype",
    "machine",
    "config",
    "outcomes",
)
"""The keys of every manifest, in order."""

ROOT = Path(__file__).resolve().parent.parent
"""The project's checkout (the folder above ``trainers/``), where ``git`` is asked."""


def build_manifest(
    *,
    tasks: Iterable[str],
    seeds: Iterable[int],
    model_sha256: str | None,
    generator: str | None,
    config: Mapping[str, Any] | None,
    outcomes: Mapping[str, Any] | None = None,
    dtype: str | None = None,
) -> dict[str, Any]:
    """A manifest with every key of :data:`FIELDS`; the code's commit and the library
    versions are looked up here. ``outcomes``: each held-out evaluation's per-task outcomes
    (a run's: panel -> step -> task -> 1/0, :func:`~agentgym.trainers.heldout.evaluations`),
    so a table can be recomputed from manifests alone. ``dtype``: the one trained in
    (``auto`` resolves by machine, :mod:`agentgym.policies.dtypes`)."""
    return {
        "tasks": list(tasks),
        "seeds": list(seeds),
        "git_commit": git_commit(),
        "model_sha256": model_sha256,
        "generator": generator,
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
        "dtype": dtype,
        "machine": machine(),
        "config": dict(config) if config is not None else None,
        "outcomes": dict(outcomes) if outcomes is not None else None,
    }


CPU_FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")
"""The CPU flags that change a run's speed and its default dtype."""


def machine() -> dict[str, Any]:
    """What ran this: the CPU (Linux's name, family and model: one name covers several
    generations), which of :data:`CPU_FEATURES` it has, the cores, and the GPU (None)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""

    def first(key: str) -> str | None:
        found = re.search(rf"^{key}\s*:\s*(.*)$", cpuinfo, re.MULTILINE)
        return found.group(1).strip() if found else None

    flags = set((first("flags") or "").split())
    return {
        "cpu": first("model name") or platform.processor() or None,
        "cpu_family_model": f"{first('cpu family')}/{first('model')}" if first("cpu family") else None,
        "cpu_features": [feature for feature in CPU_FEATURES if feature in flags],
        "cores": os.cpu_count(),
        "gpu": _gpu_name(),
    }


def _gpu_name() -> str | None:
    try:
        import torch

        return torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except Exception:  # nothing here may fail a run
        return None


def write_manifest(folder: Path, manifest: Mapping[str, Any]) -> Path:
    path = Path(folder) / MANIFEST_FILE
    path.write_text(json.dumps(manifest, indent=2, default=str) + "\n")
    return path


def git_commit(root: Path = ROOT) -> str | None:
    """``git rev-parse HEAD`` in ``root``; None outside a git checkout or without git."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def model_sha256(path: str | Path, checkpoint: str | Path | None = None) -> str | None:
    """The sha256 :meth:`~agentgym.policies.models.ModelSource.describe` gives the model
    folder ``path`` (and ``checkpoint``); None when a folder cannot be read."""
    source = ModelSource(str(path), str(path), None if checkpoint is None else str(checkpoint))
    try:
        return source.describe()["sha256"]
    except OSError as exc:
        log.warning("manifest: cannot hash the model at %s: %s", path, exc)
        return None


def source_sha256(source: Any) -> str | None:
    """:func:`model_sha256` of a loaded model's ``ModelSource`` (None without one)."""
    if source is None or not getattr(source, "path", None):
        return None
    return model_sha256(source.path, getattr(source, "checkpoint", None))
