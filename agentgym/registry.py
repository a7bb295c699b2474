"""Environment registry: name -> factory. ``make(name, **config)`` builds an instance.

Factories are given as ``"module:attr"`` strings so that listing environments never
imports heavy engines (TextWorld, the JVM, a browser). The built-in environments are
found from their folders: each ``envs/NAME/hosting.toml`` names its class and port
(:mod:`agentgym.hosting`), so adding one is its folder alone.

Third-party packages add environments without forking: an entry point in the group
``agentgym.envs`` (``NAME = "module:EnvClass"``, any callable that takes the env's
settings as keyword arguments and returns a ``TextEnv``) makes ``NAME`` a registered
environment of every process that can import the package (``docs/environments.md``).
Entry points are read on the first lookup, not imported; a built-in or explicitly
registered name wins over an entry point of the same name.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Any

from agentgym import hosting
from agentgym.contract.core import TextEnv
from agentgym.contract.errors import UnknownEnv, did_you_mean
from agentgym.contract.problems import AnswerKey

log = logging.getLogger(__name__)

EnvFactory = Callable[..., TextEnv]

ENTRY_POINT_GROUP = "agentgym.envs"

_BUILTIN: dict[str, str] = {h.env: f"agentgym.envs.{h.env}:{h.factory}" for h in hosting.builtin()}
"""The shipped envs, found from their folders' declarations, in port order."""

_registry: dict[str, EnvFactory | str] = dict(_BUILTIN)
_plugins_read = False


def _read_plugins() -> None:
    """Add the ``agentgym.envs`` entry points of installed packages, once per process."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in _registry:
            log.warning(
                "entry point %s = %s ignored: %r is already registered", entry.name, entry.value, entry.name
            )
            continue
        _registry[entry.name] = f"{entry.module}:{entry.attr}"


def register(name: str, factory: EnvFactory | str, *, overwrite: bool = False) -> None:
    """Register ``factory`` (a callable or ``"module:attr"``) under ``name``."""
    _read_plugins()
    if name in _registry and not overwrite:
        raise ValueError(f"environment {name!r} is already registered")
    _registry[name] = factory


def unregister(name: str) -> None:
    """Forget ``name`` (a test's or a plugin's own environment); unknown names are ignored."""
    _registry.pop(name, None)


def names() -> list[str]:
    _read_plugins()
    return sorted(_registry)


def builtin_names() -> list[str]:
    """The envs this package ships (no plugin, nothing registered at run time), in order."""
    return list(_BUILTIN)


def resolve(name: str) -> EnvFactory:
    """The factory registered as ``name``, imported on first use."""
    _read_plugins()
    try:
        factory = _registry[name]
    except KeyError:
        hint = did_you_mean([name], names())
        raise UnknownEnv(f"unknown environment {name!r}{hint}; registered: {', '.join(names())}") from None
    if isinstance(factory, str):
        factory = _import(name, factory)
        _registry[name] = factory
    return factory


def _import(name: str, spec: str) -> EnvFactory:
    """The callable ``"module:attr"`` names; an env that cannot load is an UnknownEnv saying why."""
    module, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise UnknownEnv(f"environment {name!r} ({spec}) cannot be loaded: {exc}") from exc
    if not callable(factory):
        raise UnknownEnv(f"environment {name!r} ({spec}) is not callable")
    return factory


def setting_names(name: str) -> list[str] | None:
    """The keyword settings environment ``name`` takes (``agentgym serve ENV --set KEY=...``);
    None when its factory takes any (``**kwargs``) or does not say."""
    try:
        parameters = inspect.signature(resolve(name)).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_settings(name: str, settings: Iterable[str]) -> None:
    """``ValueError`` naming the valid keys when ``settings`` holds a key env ``name`` does not take."""
    given = set(settings)
    valid = setting_names(name) if given else None
    unknown = sorted(given - set(valid)) if valid is not None else []
    if unknown:
        raise ValueError(
            f"unknown setting{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} for {name!r}; "
            f"valid: {', '.join(valid) or '(none)'}"
        )


def make(name: str, **config: Any) -> TextEnv:
    """Build a fresh instance of environment ``name`` with ``config``."""
    return resolve(name)(**config)


def answer_key(name: str) -> AnswerKey:
    """The answer key of the registered env ``name`` (a factory's ``answer_key``: the
    capability of serving question-and-answer problems); ValueError for an env without one."""
    if not serves_problems(name):
        raise ValueError(f"env {name!r} serves no question-and-answer problems (it has no answer key)")
    return resolve(name).answer_key  # type: ignore[attr-defined]


def serves_problems(name: str) -> bool:
    """Whether env ``name`` has an answer key (``eval --critic`` then critiques its problems)."""
    return getattr(resolve(name), "answer_key", None) is not None
