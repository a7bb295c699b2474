"""The floors of the house (docs/design.md), held by the imports themselves.

Every ``agentgym`` module's imports are read from its source: top-level ones, those inside
functions and those under ``TYPE_CHECKING`` alike (a deferred import is still a dependency).
From low to high: the env contract (``agentgym.contract``: ``core``, ``errors``, ``inputs``, ``cache``, ``sites``,
``problems``, ``dialects``) < an env
(``agentgym.envs.NAME``, which imports only the contract and itself; the contract imports only
itself) < servers, policies and
the rest of ``agentgym`` < the trainer < the Python API (``agentgym.api``) < the CLI. Nothing imports upward, no module outside
an env's folder imports that env (the registry names them as strings), nothing outside a
regime's folder (``trainers/agentevol/``) imports it (presets name it), and no two modules
import each other, however indirectly.

``KNOWN_DEBTS`` would list breaks knowingly left in the house (none today): the test fails
on any break not listed, and on a listed one that is gone, so the list only shrinks.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = "agentgym.contract"
"""The env contract's package: what an env may import besides itself."""
TOP = ("agentgym.trainers", "agentgym.api", "agentgym.cli")
"""Imported only from above: the trainer by the Python API and the CLI, the Python API (the
CLI's twin, which reads a trainer's run config) by the CLI, the CLI by nothing."""
LOOP = "agentgym.trainers.loop"
"""The trainer's loop: a regime (``trainers/regimes.py``, ``trainers/*/regime.py``) gets a
``TrainingContext`` of the run, never the trainer, so it never imports the loop."""
REGIME_SIDE = {f"agentgym.trainers.{name}" for name in ("regimes", "context", "services", "update")}
"""The regimes' modules and what they are given: none of them imports the loop."""
KNOWN_DEBTS: set[str] = set()


@functools.cache
def package_folders() -> dict[str, Path]:
    """Namespace -> folder, as ``setup.py`` installs them (its ``NAMESPACE``)."""
    (mapping,) = [
        ast.literal_eval(node.value)
        for node in ast.parse((ROOT / "setup.py").read_text()).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "NAMESPACE"
    ]
    return {name: ROOT / folder for name, folder in mapping.items()}


def modules(folders: dict[str, Path]) -> dict[str, Path]:
    """Every module's dotted name -> its file (a package by its ``__init__``)."""
    found: dict[str, Path] = {}
    for namespace, folder in folders.items():
        for path in folder.rglob("*.py"):
            if "tests" in path.relative_to(folder).parts:
                continue
            parts = [p for p in path.relative_to(folder).with_suffix("").parts if p != "__init__"]
            found[".".join([namespace, *parts])] = path
    return found


def imports(name: str, path: Path, source: str, known: dict[str, Path]) -> set[str]:
    """The known modules ``name`` (``source``, the text of ``path``) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {_owner(alias.name, known) for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import module` imports that module
                found.add(_owner(f"{base}.{alias.name}", known) or _owner(base, known))
    return found - {None, name}


def _owner(dotted: str, known: dict[str, Path]) -> str | None:
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def graph(added: dict[str, str] | None = None) -> dict[str, set[str]]:
    """Module -> the modules it imports; ``added``: source lines appended to (or making) the
    file at each relative path, as if written there."""
    added = {ROOT / path: text for path, text in (added or {}).items()}
    known = modules(package_folders()) | {_name(path): path for path in added}
    return {name: imports(name, path, _source(path, added), known) for name, path in known.items()}


def _name(path: Path) -> str:
    for namespace, folder in package_folders().items():
        if folder in path.parents:
            return ".".join([namespace, *path.relative_to(folder).with_suffix("").parts])
    raise ValueError(path)


def _source(path: Path, added: dict[Path, str]) -> str:
    text = path.read_text() if path.exists() else ""
    return text + "\n" + added.get(path, "")


def floor_breaks(edges: dict[str, set[str]]) -> Iterator[str]:
    for module, targets in edges.items():
        for target in targets:
            yield from _breaks(module, target)


def _breaks(module: str, target: str) -> Iterator[str]:
    env = _env_of(target)
    if env and _env_of(module) != env:
        yield f"{module} imports the env {env}"
    if _within(module, CONTRACT) and not _within(target, CONTRACT):
        yield f"the env contract's {module} imports {target}, outside the contract"
    if (
        _env_of(module)
        and not _env_of(target)
        and not _within(target, CONTRACT)
        and target != "agentgym.envs"
    ):
        yield f"{_env_of(module)} imports {target}, above the env contract"
    if target == LOOP and (module in REGIME_SIDE or module.endswith(".regime")):
        yield f"the regime {module} imports the loop: a regime gets a TrainingContext"
    if (folder := _regime_folder(target)) and not _within(module, folder):
        yield f"{module} imports {target}: presets name a regime and its settings by import path"
    for top in TOP:
        if _within(target, top) and not any(_within(module, t) for t in TOP[TOP.index(top) :]):
            yield f"{module} imports {target}, a floor above it"


def _env_of(module: str) -> str | None:
    parts = module.split(".")
    return ".".join(parts[:3]) if parts[:2] == ["agentgym", "envs"] and len(parts) > 2 else None


def _regime_folder(module: str) -> str | None:
    """The regime folder (``agentgym.trainers.NAME`` with a ``regime.py``) ``module`` is in."""
    parts = module.split(".")
    if parts[:2] != ["agentgym", "trainers"] or len(parts) < 3:
        return None
    has_regime = (package_folders()["agentgym.trainers"] / parts[2] / "regime.py").exists()
    return ".".join(parts[:3]) if has_regime else None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return groups


def house_breaks(added: dict[str, str] | None = None) -> set[str]:
    edges = graph(added)
    return set(floor_breaks(edges)) | {"cycle: " + " -> ".join(group) for group in cycles(edges)}


def test_the_floors_hold_and_no_module_imports_itself_back() -> None:
    found = house_breaks()
    assert found - KNOWN_DEBTS == set(), "new breaks in the house (docs/design.md, 'Rules of the house')"
    assert KNOWN_DEBTS - found == set(), "fixed: delete these from KNOWN_DEBTS"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("envs/choice/leak.py", "def f():\n    from agentgym.servers import app\n", "above the env contract"),
        (
            "agentgym/leak.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import agentgym.trainers.loop\n",
            "a floor above it",
        ),
        (
            "servers/leak.py",
            "from agentgym.envs.textworld import env\n",
            "imports the env agentgym.envs.textworld",
        ),
        ("trainers/leak.py", "from agentgym.cli import app\n", "a floor above it"),
        ("trainers/agentevol/regime.py", "from agentgym.trainers.loop import Trainer\n", "a regime gets a"),
        (
            "trainers/config.py",
            "from agentgym.trainers.agentevol.settings import AgentEvolSettings\n",
            "presets name a regime",
        ),
        (
            "agentgym/contract/problems.py",
            "def f():\n    from agentgym import registry\n",
            "outside the contract",
        ),
        ("agentgym/wire.py", "from agentgym import leak\n", "cycle: agentgym.leak -> agentgym.wire"),
    ],
)
def test_the_check_catches_a_forbidden_import(module: str, source: str, expected: str) -> None:
    """The house with one forbidden import added (deferred or type-only alike)."""
    added = {module: source}
    if module == "agentgym/wire.py":  # and a new module that imports wire back
        added["agentgym/leak.py"] = "from agentgym import wire\n"
    new = house_breaks(added) - house_breaks()
    assert any(expected in line for line in new), new


MAX_MODULE_LINES = 500
"""A room a newcomer reads in one sitting; past it, a module holds more than one job."""


def test_no_module_outside_tests_is_over_the_size_limit() -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in modules(package_folders()).items()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def test_no_two_classes_share_a_name() -> None:
    """A reader who meets a class name knows which one it is (issue 61: two ``RunContext``s,
    two ``Tool``s, two ``Summary``s once meant different things)."""
    where: dict[str, list[str]] = {}
    for name, path in modules(package_folders()).items():
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(name)
    assert {cls: found for cls, found in where.items() if len(found) > 1} == {}


NAMED_BY_REGISTRY = {"algo", "schedule", "env"}
"""Config fields whose values are registry keys (presets, horizon schedules, env folders)."""


def name_comparisons(source: str) -> list[str]:
    """The comparisons in ``source`` of a registry-keyed field (``x.algo``, ``x.schedule``,
    ``x.env``) with a literal name, or a literal collection of names."""

    def literal(node: ast.expr) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return all(literal(element) for element in node.elts)
        return isinstance(node, ast.Constant) and isinstance(node.value, str)

    return [
        ast.unparse(node)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Compare)
        and any(
            isinstance(side, ast.Attribute) and side.attr in NAMED_BY_REGISTRY
            for side in [node.left, *node.comparators]
        )
        and any(literal(side) for side in [node.left, *node.comparators])
    ]


def test_the_trainer_never_branches_on_an_algorithm_schedule_or_env_name() -> None:
    """docs/design.md: the trainer looks names up in a registry, so a new algorithm, schedule
    or env never edits it."""
    assert name_comparisons('if config.schedule == "fixed" or run.env in ("webshop",): pass') == [
        "config.schedule == 'fixed'",
        "run.env in ('webshop',)",
    ]
    trainer = package_folders()["agentgym.trainers"]
    found = {
        str(path.relative_to(ROOT)): name_comparisons(path.read_text()) for path in trainer.rglob("*.py")
    }
    assert {path: where for path, where in found.items() if where} == {}


def test_the_design_page_maps_the_namespace_as_setup_py_does() -> None:
    """docs/design.md's namespace table is setup.py's ``NAMESPACE``, row for row."""
    rows = re.findall(r"^\| `(agentgym[\w.]*)` \| `([\w/]+)/`", (ROOT / "docs/design.md").read_text(), re.M)
    assert {name: ROOT / folder for name, folder in rows} == package_folders()


def test_each_built_in_env_keeps_its_tests_in_its_folder() -> None:
    """An env is one folder, its tests included (docs/design.md): every built-in env has
    tests under ``envs/NAME/tests`` and no top-level test file is named after one env."""
    from agentgym.hosting import declared_envs

    envs = [hosting.env for hosting in declared_envs(ROOT / "envs")]
    without_tests = [env for env in envs if not list((ROOT / "envs" / env / "tests").glob("test_*.py"))]
    named_after_an_env = [
        path.name
        for path in (ROOT / "tests").glob("test_*.py")
        if any(re.fullmatch(rf"test_{env}(_\w+)?\.py", path.name) for env in envs)
    ]
    assert len(envs) >= 8 and without_tests == [] and named_after_an_env == []
