"""Registries by decoration: each entry registers where it is defined, so the names a config
accepts, the CLI lists and the checks enforce come from one table, never a hand-kept list."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def registering_in(table: dict[str, Any]) -> Callable[[str], Callable[[F], F]]:
    """A decorator factory: ``@factory(name)`` puts the function it decorates in ``table``."""

    def decorator(name: str) -> Callable[[F], F]:
        def register(function: F) -> F:
            table[name] = function
            return function

        return register

    return decorator
