"""The images' inputs, checked without Docker: every path ``docker/Dockerfile`` copies from
the build context exists and survives ``.dockerignore`` (matched by docker-py's
``exclude_paths``, the classic builder's rules), and every service of ``compose.yaml``
builds a stage the Dockerfile has. ``make docker-check`` builds and runs them for real."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml
from docker.utils.build import exclude_paths

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "docker" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the Dockerfile, continuation lines joined."""
    joined = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in joined.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#") and " " in line
    ]


def copied_from_context() -> set[str]:
    """The sources of every COPY/ADD that reads the build context (not ``--from`` a stage)."""
    sources = set()
    for instruction, arguments in instructions():
        if instruction not in ("COPY", "ADD"):
            continue
        words = json.loads(arguments) if arguments.startswith("[") else shlex.split(arguments)
        flags = [w for w in words if w.startswith("--")]
        if any(f.startswith("--from=") for f in flags):
            continue
        *copied, _destination = (w for w in words if w not in flags)
        sources |= {w.rstrip("/") or "." for w in copied}
    return sources


def test_every_copied_path_exists_and_reaches_the_build_context() -> None:
    patterns = [p for p in (ROOT / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")]
    context = exclude_paths(str(ROOT), patterns, dockerfile="docker/Dockerfile")
    sources = copied_from_context()
    assert {"pyproject.toml", "setup.py", "agentgym", "envs"} <= sources  # the parse found them
    missing = sorted(s for s in sources if not (ROOT / s).exists())
    assert not missing, f"docker/Dockerfile copies what the repository lacks: {missing}"
    excluded = sorted(s for s in sources if s not in context)
    assert not excluded, f".dockerignore keeps these out of the build context: {excluded}"
    for folder in (s for s in sources if (ROOT / s).is_dir()):  # and the files inside them
        tracked = [p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts]
        assert all(str(p.relative_to(ROOT)) in context for p in tracked), folder


def test_every_compose_service_builds_a_stage_of_the_dockerfile() -> None:
    stages = {
        arguments.split()[-1]
        for instruction, arguments in instructions()
        if instruction == "FROM" and " as " in arguments.lower()
    }
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    built = {name: service["build"] for name, service in services.items() if "build" in service}
    assert built, "compose.yaml builds nothing"
    for name, build in built.items():
        assert build["dockerfile"] == "docker/Dockerfile", name
        assert build["target"] in stages, (
            f"service {name} builds stage {build['target']!r}, not in the Dockerfile"
        )
