"""Where AgentGym keeps what it generates or converts once and reuses: TextWorld games,
search and shop indexes, embeddings, converted model weights."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(name: str) -> Path:
    """``$AGENTGYM_CACHE/<name>``, else ``~/.cache/agentgym/<name>`` (read at call time, so a
    test or a server may point it elsewhere before use)."""
    base = os.environ.get("AGENTGYM_CACHE")
    return (Path(base) if base else Path.home() / ".cache" / "agentgym") / name
