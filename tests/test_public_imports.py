"""Every import path a user reads in the README and docs works, and the flat module paths of
earlier versions still import, as the very modules they moved to (``agentgym/moved.py``)."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from agentgym.moved import MOVED

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
IMPORT_LINE = re.compile(r"^\s*from (agentgym[\w.]*) import ([\w, ]+)$|^\s*import (agentgym[\w.]*)$", re.M)
DOTTED = re.compile(r"`(agentgym(?:\.[a-z_]\w*)+)")
"""A module or attribute path in backticks (placeholders such as ``agentgym.envs.NAME`` are
upper case, so they do not match past the last lower-case part)."""


def documented_paths() -> list[str]:
    """``module`` or ``module.attribute`` for each import line and backticked path in the docs."""
    paths = set()
    for page in PAGES:
        text = page.read_text()
        for module, names, plain in IMPORT_LINE.findall(text):
            paths |= {f"{module}.{name.strip()}" for name in names.split(",") if name.strip()} or {plain}
        paths |= set(DOTTED.findall(text))
    return sorted(paths)


def resolve(path: str) -> object:
    """The module or attribute ``path`` names: the longest importable prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            found = getattr(found, attribute)
        return found
    raise ModuleNotFoundError(path)


@pytest.mark.parametrize("path", documented_paths())
def test_every_documented_import_path_resolves(path: str) -> None:
    resolve(path)


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_a_flat_path_of_earlier_versions_is_the_module_it_moved_to(old: str, new: str) -> None:
    assert importlib.import_module(old) is importlib.import_module(new)
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists(), "a file at the old path would shadow it"
