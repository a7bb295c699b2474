"""Where AgentGym keeps what it generates or converts once and reuses: TextWorld games,
search and shop indexes, embeddings, converted model weights."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

_HASHES: dict[str, tuple[int, int, str]] = {}
"""In-process cache of :func:`file_sha256`: absolute path -> (size, mtime_ns, sha256)."""


def cache_dir(name: str) -> Path:
    """``$AGENTGYM_CACHE/<name>``, else ``~/.cache/agentgym/<name>`` (read at call time, so a
    test or a server may point it elsewhere before use)."""
    base = os.environ.get("AGENTGYM_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "agentgym") / name


def file_sha256(path: Path) -> str:
    """The file's sha256, cached by absolute path, size and modification time (in this
    process and under ``cache_dir("hashes")``), so an unchanged weights file is read once."""
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
