"""The config as files a user reads and writes: ``agentgym train --print-config`` (the
resolved config as YAML, each field's doc above it) and the shipped recipes of
``agentgym train --recipe ALGO-ENV``.

A recipe is two YAML layers: the env's ``envs/ENV/recipe.yaml`` (what suits the
environment: turn limits, reply length, format; in the env's own folder) then the
algorithm's layer: ``algo: ALGO`` for every preset (``presets.py``), plus
``algos/ALGO.yaml`` where an algorithm needs more. An algorithm layer that sets ``env``
(critique-rl: math) pairs only with that env. Not to be confused with the training regimes
(``regimes.py``, ``agentevol/``, ``critique_rl/``) the trainer runs.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

import agentgym.envs
from agentgym.contract.errors import did_you_mean
from agentgym.trainers.config import TrainConfig, regime_sections
from agentgym.trainers.presets import PRESETS

RECIPE_DIR = Path(__file__).parent / "recipe_yaml"
ENVS_DIR = Path(agentgym.envs.__file__).parent
ENV_LAYER = "recipe.yaml"
"""An env's training layer, in its folder (``envs/NAME/recipe.yaml``)."""


# ----- the commented YAML of --print-config ---------------------------------------------------


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source (Python keeps
    no attribute docstrings at run time)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs


def commented_yaml(config: Any) -> str:
    """``config`` (a dataclass) as YAML that loads back to it, each field's doc as comments."""
    return "\n".join(_commented_lines(config, "")) + "\n"


def _commented_lines(config: Any, indent: str) -> Iterator[str]:
    docs = field_docs(type(config))
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        # A regime's section is documented by its settings class (it is not in the source).
        doc = docs.get(f.name) or (inspect.getdoc(value) if f.name in regime_sections() else "")
        yield from (f"{indent}# {line}".rstrip() for line in doc.splitlines())
        if dataclasses.is_dataclass(value):
            yield f"{indent}{f.name}:"
            yield from _commented_lines(value, indent + "  ")
            continue
        flow = yaml.safe_dump(value, default_flow_style=True, width=1 << 16).removesuffix("...\n")
        yield f"{indent}{f.name}: {flow.strip()}"


# ----- shipped recipes -------------------------------------------------------------------------


def _layers(kind: str) -> dict[str, dict[str, Any]]:
    if kind == "envs":  # each env's own folder: envs/NAME/recipe.yaml
        return {path.parent.name: _read(path) for path in sorted(ENVS_DIR.glob(f"*/{ENV_LAYER}"))}
    files = {path.stem: _read(path) for path in sorted((RECIPE_DIR / kind).glob("*.yaml"))}
    # Every preset is a recipe's algorithm, with its file where it has one.
    return {name: {"algo": name} | files.get(name, {}) for name in PRESETS}


def _read(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text()) or {}
    if not isinstance(loaded, dict):
        raise ValueError(f"{path} must hold a mapping of config fields")
    return loaded


def recipe_names() -> list[str]:
    """Every shipped recipe, ``ALGO-ENV``."""
    envs = _layers("envs")
    return [
        f"{algo}-{env}"
        for algo, layer in _layers("algos").items()
        for env in envs
        if layer.get("env", env) == env
    ]


def env_layer(env: str) -> dict[str, Any]:
    """What suits ``env`` (``envs/ENV/recipe.yaml``): the base of every run on it, under any
    recipe, file or flag; {} for an env that ships none."""
    return _layers("envs").get(env, {})


def layered_config(values: dict[str, Any], overrides: dict[str, Any] | None = None) -> TrainConfig:
    """``values``, then ``overrides``, over the layer of the env they end up on. The env is
    known only once every layer is read; its own layer then goes under them all, so
    ``--env search`` gets search's reply length and turn limits, not textworld's defaults."""
    overrides = overrides or {}
    env = TrainConfig.from_dict(values).with_overrides(overrides).env
    return TrainConfig.from_dict(env_layer(env) | values).with_overrides(overrides)


def saved_config(folder: Path) -> TrainConfig:
    """The config a run folder saved, its ``output_dir`` that folder as an absolute path (the
    saved one may be relative to another directory, or name where the run was moved from);
    FileNotFoundError when the folder holds no run."""
    folder = Path(folder).absolute()
    if not folder.exists():
        raise FileNotFoundError(
            f"{folder} does not exist: nothing to resume (leave out --resume to start a run there)"
        )
    saved = folder / "config.yaml"
    if not saved.exists():
        raise FileNotFoundError(f"{folder} holds no run to resume: it has no config.yaml")
    return TrainConfig.load(saved).with_overrides({"output_dir": str(folder)})


def default_run_folder(config: TrainConfig) -> Path:
    """``runs/<algo>-<env>-<time>``: where a run goes when no folder is given."""
    return Path("runs") / f"{config.algo}-{config.env}-{time.strftime('%Y%m%d-%H%M%S')}"


def recipe(name: str) -> dict[str, Any]:
    """The config fields of recipe ``name`` (env layer, then algorithm layer); ValueError
    listing the recipes when there is no such one."""
    envs, algos = _layers("envs"), _layers("algos")
    for env in sorted(envs, key=len, reverse=True):  # the longest env name that ends it
        algo = name.removesuffix(f"-{env}")
        if algo != name and algo in algos and algos[algo].get("env", env) == env:
            return envs[env] | algos[algo]
    hint = did_you_mean([name], recipe_names())
    raise ValueError(f"no recipe {name!r}{hint}; shipped recipes: {', '.join(recipe_names())}")
