"""``agentgym generate`` and ``new-env``: the files written from the registry, and a new env's folder."""

from __future__ import annotations

import keyword
import re
import shutil
import subprocess
import sys
import tempfile
from importlib.resources import files
from pathlib import Path
from string import Template
from typing import Annotated

import typer

from agentgym import hosting, registry
from agentgym.cli.common import EXIT_USAGE, console, fail

commands = typer.Typer()

SOURCE_TREE = Path(__file__).resolve().parents[2]
"""The checkout this package runs from (an editable install), where generated files live."""
TEMPLATES = {
    "__init__.py.tmpl": "__init__.py",
    "env.py.tmpl": "env.py",
    "README.md.tmpl": "README.md",
    "recipe.yaml.tmpl": "recipe.yaml",
    "hosting.toml.tmpl": "hosting.toml",
    "test_env.py.tmpl": "tests/test_{name}_env.py",
}


def _checkout(root: Path | None) -> Path:
    root = root or SOURCE_TREE
    if not (root / "envs").is_dir() or not (root / "agentgym" / "registry.py").is_file():
        raise fail(
            f"{root} is not an AgentGym checkout (no envs/ or agentgym/registry.py); give --root", EXIT_USAGE
        )
    return root


@commands.command()
def generate(
    check: Annotated[bool, typer.Option("--check", help="Write nothing; exit 1 if a file is stale.")] = False,
    root: Annotated[
        Path | None, typer.Option(help="The checkout (default: the one this package runs from).")
    ] = None,
) -> None:
    """Write the files made from the registry and each env's hosting.toml: compose.yaml, the
    Dockerfile, docs/api.md and the docs' port table."""
    from agentgym.servers.deploy import generated_files

    stale = []
    for path, render in generated_files(_checkout(root)).items():
        content = render()
        if path.exists() and path.read_text() == content:
            continue
        stale.append(path)
        if not check:
            path.write_text(content)
    for path in stale:
        console.print(f"{'stale' if check else 'wrote'} {path}")
    if check and stale:
        raise typer.Exit(1)
    if not stale:
        console.print("every generated file is current")


@commands.command("new-env")
def new_env(
    name: Annotated[
        str, typer.Argument(help="The new env's name: lower case, digits and _ (a Python identifier).")
    ],
    root: Annotated[
        Path | None,
        typer.Option(help="The checkout to add it to (default: the one the working directory is in)."),
    ] = None,
) -> None:
    """Make envs/NAME (a working number-guessing env with its page, training layer, hosting
    declaration and test), register it, and regenerate the deployment files: all of it, or
    nothing when a step fails."""
    root = _checkout(root) if root is not None else _working_checkout()
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise fail(
            f"{name!r} is not a valid env name: lower case letters, digits and _, starting with a letter",
            EXIT_USAGE,
        )
    if name in registry.names() or (root / "envs" / name).exists():
        raise fail(f"env {name!r} exists already", EXIT_USAGE)
    try:
        console.print(_add_env(root, name), end="")
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        detail = exc.stderr.strip().splitlines()[-1] if getattr(exc, "stderr", None) else str(exc)
        raise fail(f"new-env {name} failed and changed nothing in {root}: {detail}") from None
    console.print(f"made envs/{name}/ in {root}, registered {name!r}; try it: pytest envs/{name}")
    if root.resolve() != SOURCE_TREE:
        console.print(f"(the agentgym you ran comes from {SOURCE_TREE}: `pip install -e {root}` to serve it)")


def _working_checkout() -> Path:
    """The checkout the working directory is in; exit 2 outside any (new-env never writes
    into the installed package's tree unasked)."""
    for folder in (Path.cwd(), *Path.cwd().parents):
        if (folder / "envs").is_dir() and (folder / "agentgym" / "registry.py").is_file():
            return folder
    raise fail(
        f"{Path.cwd()} is not inside an AgentGym checkout: cd into the one to add the env to, or "
        f"give --root (this agentgym runs from {SOURCE_TREE})",
        EXIT_USAGE,
    )


def _add_env(root: Path, name: str) -> str:
    """Write the folder (its ``hosting.toml`` registers it, on the next free port),
    regenerate (returns what ``generate`` printed): on any failure, put back every file as
    it was (the folder goes, the generated files return)."""
    from agentgym.servers.deploy import generated_files

    kept = {path: path.read_bytes() for path in generated_files(root) if path.is_file()}
    folder = root / "envs" / name
    port = max((h.port for h in hosting.declared_envs(root / "envs")), default=0) + 1
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=root / "envs"))
    try:
        _write_folder(staging, name, port)
        staging.rename(folder)
        # A new process: this one's registry was read before the folder was there.
        # (`-m` puts the working directory first on the path: run it in the checkout itself)
        return subprocess.run(
            [sys.executable, "-m", "agentgym.cli", "generate", "--root", str(root)],
            cwd=root,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(folder, ignore_errors=True)
        for path, content in kept.items():
            path.write_bytes(content)
        raise


def _write_folder(folder: Path, name: str, port: int) -> None:
    words = {
        "name": name,
        "port": str(port),
        "Class": _class_name(name),
        "Title": name.replace("_", " ").capitalize(),
        "description": "Guess a secret number from higher/lower hints (a new env's starting point).",
    }
    templates = files("agentgym.cli.new_env")
    for template, target in TEMPLATES.items():
        path = folder / target.format(name=name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(templates.joinpath(template).read_text()).substitute(words))


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Env"
