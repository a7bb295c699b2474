"""``manifest.json``: what a report's figures came from, written beside them.

The trainer writes one into the run folder beside ``heldout.json`` at the end of a run;
``bench/learning.py`` writes one beside its table. Fields (:data:`FIELDS`): the test task
ids, the seeds, the git commit of this code (None outside a git checkout), the model's
sha256, the generator, the torch, transformers and Python versions, and the config as the
trainer saves it. Nothing here may fail a run: what cannot be found is None.

The model's sha256 is the one ``agentgym eval`` records in ``results.json``
(:meth:`agentgym.policies.models.ModelSource.describe`): over the names and sha256 of the
files of the model folder loaded (and of the checkpoint merged in, for a run). Each file's
sha256 is cached by path, size and modification time under ``$AGENTGYM_CACHE/hashes``, so
it is computed once per file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from agentgym.cache import cache_dir

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
    "config",
)
"""The keys of every manifest, in order."""

ROOT = Path(__file__).resolve().parent.parent
"""The project's checkout (the folder above ``trainers/``), where ``git`` is asked."""

_HASHES: dict[str, tuple[int, int, str]] = {}
"""In-process cache: absolute path -> (size, mtime_ns, sha256)."""


def build_manifest(
    *,
    tasks: Iterable[str],
    seeds: Iterable[int],
    model_sha256: str | None,
    generator: str | None,
    config: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A manifest with every key of :data:`FIELDS`; the code's commit and the library
    versions are looked up here."""
    return {
        "tasks": list(tasks),
        "seeds": list(seeds),
        "git_commit": git_commit(),
        "model_sha256": model_sha256,
        "generator": generator,
        "torch": package_version("torch"),
        "transformers": package_version("transformers"),
        "python": platform.python_version(),
        "config": dict(config) if config is not None else None,
    }


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
    try:
        digest = hashlib.sha256(folder_sha256(Path(path)).encode())
        if checkpoint is not None:
            digest.update(folder_sha256(Path(checkpoint)).encode())
    except OSError as exc:
        log.warning("manifest: cannot hash the model at %s: %s", path, exc)
        return None
    return digest.hexdigest()


def source_sha256(source: Any) -> str | None:
    """:func:`model_sha256` of a loaded model's ``ModelSource`` (None without one)."""
    if source is None or not getattr(source, "path", None):
        return None
    return model_sha256(source.path, getattr(source, "checkpoint", None))


def folder_sha256(folder: Path) -> str:
    """sha256 over the names and sha256 of the files in ``folder`` (not hidden ones, not
    sub-folders), as :func:`agentgym.policies.models.folder_digest`, each file's hash cached."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        digest.update(path.name.encode() + b"\0" + bytes.fromhex(file_sha256(path)))
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """The file's sha256, cached by absolute path, size and modification time (in this
    process and on disk), so an unchanged weights file is read once."""
    path = Path(path).resolve()
    stat = path.stat()
    key, stamp = str(path), (stat.st_size, stat.st_mtime_ns)
    cached = _HASHES.get(key) or _disk_cache().get(key)
    if cached is not None and tuple(cached[:2]) == stamp:
        _HASHES[key] = (*stamp, cached[2])
        return cached[2]
    with open(path, "rb") as handle:
        value = hashlib.file_digest(handle, "sha256").hexdigest()
    _HASHES[key] = (*stamp, value)
    _store(key, [*stamp, value])
    return value


def _cache_file() -> Path:
    return cache_dir("hashes") / "sha256.json"


def _disk_cache() -> dict[str, list[Any]]:
    try:
        loaded = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _store(key: str, entry: list[Any]) -> None:
    """Add ``entry`` to the on-disk cache (written whole, atomically); a cache that cannot be
    written is only a cache."""
    try:
        entries = _disk_cache()
        entries[key] = entry
        target = _cache_file()
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(entries))
        temporary.replace(target)
    except OSError as exc:
        log.debug("sha256 cache not written: %s", exc)
