"""Every link and repository path in the docs resolves (generated docs: test_generated_files.py)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "envs").glob("*/README.md")),
]
DOCS.append(ROOT / "bench" / "RESULTS.md")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"`((?:agentgym|envs|servers|trainers|docker|docs|bench|tests)/[\w./-]*)`")
PLACEHOLDER = re.compile(r"\b(NAME|ENV|ALGO)\b|-v\d+$")
"""A path pattern (``envs/NAME/``) or a Gymnasium id (``agentgym/textworld-v0``), not a file."""


def broken_references(doc: Path) -> list[str]:
    """Relative links and backticked repository paths in ``doc`` that name nothing on disk."""
    text = doc.read_text()
    broken = []
    for target in LINK.findall(text):
        path = target.split("#")[0]
        if path and not re.match(r"[a-z]+:", path) and not (doc.parent / path).exists():
            broken.append(target)
    for path in REPO_PATH.findall(text):
        if not PLACEHOLDER.search(path) and not (ROOT / path.rstrip(".")).exists():
            broken.append(path)
    return broken


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_path_in_the_docs_exists(doc: Path) -> None:
    assert broken_references(doc) == []


def test_the_reference_check_finds_a_broken_link(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text("[gone](gone.md) and `trainers/no_such_module.py`, [web](https://x.org)")
    assert broken_references(doc) == ["gone.md", "trainers/no_such_module.py"]


def test_the_readme_lists_every_algorithm_preset() -> None:
    from agentgym.trainers.presets import PRESETS

    row = next(
        line for line in (ROOT / "README.md").read_text().splitlines() if "agentgym train --algo" in line
    )
    assert re.findall(r"`([\w+-]+)`", row.split("--algo`")[1].split(";")[0]) == list(PRESETS)
