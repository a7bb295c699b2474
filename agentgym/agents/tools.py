"""An environment's commands as OpenAI tools: one function per action type.

The action types come from the commands the env lists in ``info["available_actions"]``:
``verb[argument]`` commands (webshop, search: ``click[buy now]``) give a function ``verb``
with a string ``argument``; other commands are grouped by their first word (textworld's
``take coin``, ``go north``: functions ``take`` and ``go`` whose ``argument`` is one of the
listed rests, an enum; a lone verb such as ``look`` takes no argument). A listed argument
that is a ``<placeholder>`` (webshop's ``search[<query>]``) is free text. An env that lists
no commands gets the one function ``act(action)``.

:meth:`ActionTools.command` turns a call back into the command sent to the env.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

ACT = "act"
"""The function of envs that list no commands (the json agent format's name for it too)."""
_BRACKETED = re.compile(r"^([A-Za-z_][\w-]*)\[(.*)\]$", re.S)
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")


@dataclass
class ActionType:
    """The commands of one verb: ``bracketed`` (``verb[arg]``) or spaced (``verb arg``)."""

    verb: str
    bracketed: bool
    arguments: list[str] = field(default_factory=list)
    """The listed arguments (``""`` for the bare verb)."""

    def schema(self, name: str) -> dict[str, Any]:
        """The OpenAI ``tools`` entry of this action type."""
        given = [a for a in self.arguments if a]
        free = any(a.startswith("<") and a.endswith(">") for a in given)
        properties: dict[str, Any] = {}
        if given:
            argument: dict[str, Any] = {"type": "string"}
            if free:
                argument["description"] = f"free text, e.g. {given[0]}"
            else:
                argument["enum"] = given
            properties["argument"] = argument
        example = self.render(self.arguments[0] if self.arguments else "")
        parameters = {
            "type": "object",
            "properties": properties,
            "required": ["argument"] if given and "" not in self.arguments else [],
        }
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": f"the command '{self.verb} ...', e.g. {example!r}",
                "parameters": parameters,
            },
        }

    def render(self, argument: str) -> str:
        if self.bracketed:
            return f"{self.verb}[{argument}]"
        return f"{self.verb} {argument}".strip()


class ActionTools:
    """The tools for one turn's listed commands, and the way back from a call to a command."""

    def __init__(self, actions: list[str] | None) -> None:
        self.types: dict[str, ActionType] = {}
        for action in actions or []:
            kind = _action_type(action)
            name = self._name_for(kind)
            self.types.setdefault(name, ActionType(kind.verb, kind.bracketed)).arguments.extend(
                kind.arguments
            )

    def _name_for(self, kind: ActionType) -> str:
        """A function name (``[A-Za-z0-9_-]{1,64}``) for ``kind``'s verb and style; the same
        verb in the other style gets a suffix."""
        base = (_NAME_CHARS.sub("_", kind.verb) or "do")[:60]
        name, n = base, 1
        while name in self.types and (self.types[name].verb, self.types[name].bracketed) != (
            kind.verb,
            kind.bracketed,
        ):
            n += 1
            name = f"{base}_{n}"
        return name

    def schemas(self) -> list[dict[str, Any]]:
        """The request's ``tools``."""
        if not self.types:
            parameters = {
                "type": "object",
                "properties": {"action": {"type": "string", "description": "one command"}},
                "required": ["action"],
            }
            return [
                {
                    "type": "function",
                    "function": {
                        "name": ACT,
                        "description": "act in the environment",
                        "parameters": parameters,
                    },
                }
            ]
        return [kind.schema(name) for name, kind in self.types.items()]

    def command(self, name: str, arguments: str) -> str:
        """The env command of a call (``arguments``: the JSON string OpenAI sends); ValueError
        for an unknown function or arguments that are not a JSON object."""
        try:
            parsed = json.loads(arguments or "{}")
        except json.JSONDecodeError:
            raise ValueError(f"the arguments of {name!r} are not valid JSON: {arguments[:100]!r}") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"the arguments of {name!r} are not a JSON object")
        if not self.types and name == ACT:
            return str(parsed.get("action", ""))
        if name not in self.types:
            raise ValueError(f"unknown function {name!r}; the functions are {', '.join(self.types) or ACT}")
        return self.types[name].render(str(parsed.get("argument", "")))


def _action_type(action: str) -> ActionType:
    bracketed = _BRACKETED.match(action.strip())
    if bracketed:
        return ActionType(bracketed.group(1), True, [bracketed.group(2)])
    verb, _, rest = action.strip().partition(" ")
    return ActionType(verb, False, [rest.strip()])
