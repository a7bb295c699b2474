"""Input rules: what a client may send, checked before any engine sees it.

Engines are C interpreters, JVMs and browsers; a byte they were never meant to read can
crash or hang them (a NUL or 0x0E-0x15 inside an action made jericho's Z-machine
segfault and took every session of the server with it). So every action and every reset
option is checked here, once, and refused with a 4xx (:class:`InvalidAction` 400 for an
action, :class:`SchemaError` 422 for an option) that leaves the session as it was. Only
input that passed these rules reaches an engine, so an exception an engine raises after
that is a real engine failure (503 ``engine_failed``).

Each environment states its engine's needs in an :class:`ActionRules` (``TextEnv.action_rules``);
options shared by every env are checked by :func:`check_common_options`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

from agentgym.contract.errors import InvalidAction, SchemaError

MAX_ACTION_CHARS = 2000
MAX_TURNS_LIMIT = 100_000
"""The largest ``options.max_turns`` accepted: far above any real episode, small enough
that no counter or schedule built from it misbehaves."""
MAX_OPTION_DEPTH = 16
"""Containers nested in ``options`` at most: an unknown key nested ~500 deep passed every
check and then broke the engine worker's pickling (503, and a reset lost its session)."""
MAX_OPTION_VALUES = 1000
"""Values in ``options`` at most (containers and scalars, keys not counted)."""
MAX_OPTION_CHARS = 16 * 1024
"""Characters of keys and strings in ``options`` at most."""

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""C0/C1 control characters except tab, newline and carriage return (which free-text
answers, e.g. a math solution, legitimately contain)."""
_SURROGATE = re.compile(r"[\ud800-\udfff]")
"""Lone surrogates: JSON's ``\\ud800`` escapes decode to them, but they are no text and
cannot be encoded to UTF-8 (engines, logs and our own JSON answers would fail on them)."""


@dataclass(frozen=True)
class ActionRules:
    """What one engine accepts as an action. The defaults suit Python engines."""

    max_chars: int = MAX_ACTION_CHARS
    """Characters at most (after normalisation and stripping)."""
    max_bytes: int | None = None
    """UTF-8 bytes at most, where the engine reads a fixed buffer. Longer actions are
    refused, never cut: a cut can split a multibyte character and silently changes the command."""
    normal_form: str = "NFC"
    """Unicode normalisation applied first (NFKC also folds full-width letters and the like)."""
    allowed: re.Pattern[str] | None = None
    """When set, every character must match it (e.g. printable ASCII for a Z-machine)."""
    allowed_doc: str = ""
    """How ``allowed`` reads in an error message."""
    forbidden: str = ""
    """Characters the engine gives a meaning of its own (refused anywhere in the action)."""


def clean_action(action: object, rules: ActionRules) -> str:
    """The action as the engine should get it (normalised, stripped), or InvalidAction."""
    if not isinstance(action, str):
        raise InvalidAction(f"action must be a string, got {type(action).__name__}")
    if _SURROGATE.search(action):
        raise InvalidAction("action contains a lone UTF-16 surrogate (not valid Unicode text)")
    action = unicodedata.normalize(rules.normal_form, action).strip()
    if not action:
        raise InvalidAction("action is empty")
    if len(action) > rules.max_chars:
        raise InvalidAction(f"action is longer than {rules.max_chars} characters")
    _refuse_characters(action, rules)
    if rules.max_bytes is not None and len(action.encode()) > rules.max_bytes:
        raise InvalidAction(
            f"action is longer than {rules.max_bytes} bytes (UTF-8); this engine reads no more"
        )
    return action


def _refuse_characters(action: str, rules: ActionRules) -> None:
    control = _CONTROL.search(action)
    if control:
        raise InvalidAction(f"action contains the control character {control.group()!r}")
    if rules.allowed is not None:
        bad = next((c for c in action if not rules.allowed.fullmatch(c)), None)
        if bad is not None:
            raise InvalidAction(f"action contains {bad!r}; this environment accepts {rules.allowed_doc}")
    bad = next((c for c in action if c in rules.forbidden), None)
    if bad is not None:
        raise InvalidAction(f"action contains {bad!r}, which this environment's engine reserves")


def decimal(text: str, max_digits: int = 9) -> int | None:
    """``text`` as a non-negative int if it is 1..max_digits ASCII digits, else None.
    (``str.isdigit`` accepts '²' and other digits ``int`` refuses, and very long digit
    strings are slow or refused by ``int``.)"""
    if 0 < len(text) <= max_digits and text.isascii() and text.isdigit():
        return int(text)
    return None


def check_common_options(options: object) -> dict[str, Any]:
    """Reset options every env understands, type-checked: ``max_turns`` (null or an
    integer 0..MAX_TURNS_LIMIT, 0 and null meaning the env's default), ``split`` (a string), ``index`` (an integer >= 0).
    Other keys pass through for the env's own check. Raises SchemaError (422)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise SchemaError(f"options must be an object, got {type(options).__name__}")
    _check_size(options)
    options = dict(options)
    if options.get("max_turns") is not None:
        options["max_turns"] = as_integer(options["max_turns"], "options.max_turns", 0, MAX_TURNS_LIMIT)
    if "split" in options and not isinstance(options["split"], str):
        raise SchemaError(f"options.split must be a string, got {type(options['split']).__name__}")
    if "index" in options:
        options["index"] = as_integer(options["index"], "options.index", 0, None)
    return options


def _check_size(options: dict[str, Any]) -> None:
    """SchemaError unless ``options`` is within MAX_OPTION_DEPTH, _VALUES and _CHARS. Walked
    without recursion, so no nesting can exhaust the stack here."""
    values, chars = 0, 0
    pending: list[tuple[object, int]] = [(options, 0)]
    while pending:
        value, depth = pending.pop()
        values += 1
        if depth > MAX_OPTION_DEPTH:
            raise SchemaError(f"options are nested more than {MAX_OPTION_DEPTH} deep")
        if isinstance(value, dict):
            chars += sum(len(key) for key in value if isinstance(key, str))
            pending += [(item, depth + 1) for item in value.values()]
        elif isinstance(value, list | tuple):
            pending += [(item, depth + 1) for item in value]
        elif isinstance(value, str):
            chars += len(value)
        if values + len(pending) > MAX_OPTION_VALUES:
            raise SchemaError(f"options hold more than {MAX_OPTION_VALUES} values")
        if chars > MAX_OPTION_CHARS:
            raise SchemaError(f"options hold more than {MAX_OPTION_CHARS} characters")


def as_integer(value: object, name: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in [low, high]: JSON integers, and floats with an integral
    value (5.0); never bools, strings, NaN or infinities."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"{name} must be an integer, got {_show(value)}")
    if value < low or (high is not None and value > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise SchemaError(f"{name} must be in {bound}, got {_show(value)}")
    return value


def _show(value: object) -> str:
    """A short, JSON-safe rendering of a bad value for an error message."""
    try:
        text = repr(value)
    except ValueError:  # an int too long for Python to print
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"  # type: ignore[union-attr]
    return text if len(text) <= 40 else text[:37] + "..."
