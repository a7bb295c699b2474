"""Environment registry: name -> factory. ``make(name, **config)`` builds an instance.

Factories are given as ``"module:attr"`` strings so that listing environments never
imports heavy engines (TextWorld, the JVM, a browser). Adding an environment is one
line in ``_BUILTIN`` plus its folder under ``envs/``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from agentgym.core import TextEnv
from agentgym.errors import UnknownEnv

EnvFactory = Callable[..., TextEnv]

_BUILTIN: dict[str, str] = {
    "textworld": "agentgym.envs.textworld:TextWorldEnv",
    "choice": "agentgym.envs.choice:ChoiceEnv",
    "sciworld": "agentgym.envs.sciworld:SciWorldEnv",
    "webshop": "agentgym.envs.webshop:WebShopEnv",
    "search": "agentgym.envs.search:SearchEnv",
    "math": "agentgym.envs.math:MathEnv",
}

_registry: dict[str, EnvFactory | str] = dict(_BUILTIN)


def register(name: str, factory: EnvFactory | str, *, overwrite: bool = False) -> None:
    """Register ``factory`` (a callable or ``"module:attr"``) under ``name``."""
    if name in _registry and not overwrite:
        raise ValueError(f"environment {name!r} is already registered")
    _registry[name] = factory


def unregister(name: str) -> None:
    """Forget ``name`` (a test's or a plugin's own environment); unknown names are ignored."""
    _registry.pop(name, None)


def names() -> list[str]:
    return sorted(_registry)


def resolve(name: str) -> EnvFactory:
    """The factory registered as ``name``, imported on first use."""
    try:
        factory = _registry[name]
    except KeyError:
        raise UnknownEnv(f"unknown environment {name!r}; registered: {', '.join(names())}") from None
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
        _registry[name] = factory
    return factory


def make(name: str, **config: Any) -> TextEnv:
    """Build a fresh instance of environment ``name`` with ``config``."""
    return resolve(name)(**config)
