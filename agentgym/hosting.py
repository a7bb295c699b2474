"""How each built-in env is registered and hosted: its folder's ``hosting.toml``.

One declaration per env (``envs/NAME/hosting.toml``) names its class (the registry finds
the built-in envs by these files: no list of them is kept by hand) and its port offset,
and says what its server needs beyond the package: the pip extra its image installs, the
Debian packages, the default session cap and the ``--set`` settings a deployment passes.
``agentgym generate`` writes ``compose.yaml``, the Dockerfile's per-env stages, the port
tables and the README's env row from these; the Makefile reads the extras and packages to
install. Standard library only: ``python3 agentgym/hosting.py extras|apt`` runs before
any venv exists.
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

FILE = "hosting.toml"
DEFAULT_MAX_SESSIONS = 64


@dataclass(frozen=True)
class Setting:
    """A ``--set NAME=...`` a deployment passes, read from an environment variable."""

    name: str
    variable: str
    default: str | int | float


@dataclass(frozen=True)
class Hosting:
    env: str
    factory: str = ""
    """The env's class (or any factory), an attribute of its package ``agentgym.envs.NAME``."""
    port: int = 0
    """Its server's port: the base port plus this (unique among the built-in envs; a new
    env takes the next one, so no existing port moves)."""
    highlight: str = ""
    """A few words the README's env row adds after its name."""
    extra: str | None = None
    """The pip extra its server needs (its Docker image's name); None: the core image."""
    apt: tuple[str, ...] = ()
    """Debian packages its server needs (installed in its image and by ``make setup``)."""
    max_sessions: int = DEFAULT_MAX_SESSIONS
    """The default session cap of a deployed server."""
    settings: tuple[Setting, ...] = field(default=())
    note: str = ""
    """Why its image or settings are as they are (a comment in the generated files)."""

    @property
    def image(self) -> str:
        """The Dockerfile target and image its server runs in."""
        return self.extra or "core"


def read(env: str, path: Path) -> Hosting:
    """The declaration in ``path`` (an env folder's ``hosting.toml``); a clear error for a bad one."""
    try:
        data = tomllib.loads(path.read_text())
        settings = tuple(Setting(name, **spec) for name, spec in data.pop("settings", {}).items())
        return Hosting(env=env, apt=tuple(data.pop("apt", ())), settings=settings, **data)
    except (tomllib.TOMLDecodeError, TypeError) as exc:
        raise ValueError(f"{path}: not a valid hosting declaration: {exc}") from exc


def folder_hosting(folder: Path) -> Hosting:
    """An env folder's declaration (an env without ``hosting.toml`` needs nothing beyond the core)."""
    path = folder / FILE
    return read(folder.name, path) if path.exists() else Hosting(env=folder.name)


def of(env: str) -> Hosting:
    """Built-in env ``env``'s declaration, from its installed folder."""
    from importlib.resources import files

    return folder_hosting(Path(str(files(f"agentgym.envs.{env}"))))


def builtin() -> list[Hosting]:
    """The declarations of the installed ``agentgym.envs`` folders that name a factory, in
    port order: the built-in envs."""
    from importlib.resources import files

    return declared_envs(Path(str(files("agentgym.envs"))))


def declared_envs(envs: Path) -> list[Hosting]:
    """The declarations in the env folders under ``envs`` that name a factory, in port
    order; ``ValueError`` when two share a port or one has none."""
    found = [
        folder_hosting(f) for f in envs.iterdir() if (f / FILE).is_file() and (f / "__init__.py").is_file()
    ]
    declared = sorted((h for h in found if h.factory), key=lambda h: h.port)
    ports = [h.port for h in declared]
    if bad := [h.env for h in declared if h.port < 1 or ports.count(h.port) > 1]:
        raise ValueError(f"envs {', '.join(bad)}: each needs its own port >= 1 in its {FILE}")
    return declared


def session_cap(env: str) -> int:
    """The session cap a server of ``env`` starts with unless told: its folder's
    declaration, else the default (a plug-in env has no folder here)."""
    try:
        return of(env).max_sessions
    except ModuleNotFoundError:
        return DEFAULT_MAX_SESSIONS


def _source_tree() -> list[Hosting]:
    """Every env's declaration in this source tree (before anything is installed)."""
    return declared_envs(Path(__file__).resolve().parents[1] / "envs")


def main(argv: list[str]) -> int:
    """``extras``: the env extras, comma-separated; ``apt``: their Debian packages, one line."""
    declared = _source_tree()
    if argv == ["extras"]:
        print(",".join(sorted({h.extra for h in declared if h.extra})))
    elif argv == ["apt"]:
        print(" ".join(sorted({p for h in declared for p in h.apt})))
    else:
        print("usage: python3 agentgym/hosting.py extras|apt", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
