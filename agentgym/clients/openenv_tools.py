"""OpenEnv's MCP environments (``MCPEnvironment``) through :class:`~agentgym.clients.openenv_client.OpenEnvClient`.

Such an env's action is a tool call (``CallToolAction``: ``tool_name`` and an
``arguments`` object), not one text field, and each call answers a
``CallToolObservation`` (the tool's result or error; reward and done as the env sets them).
The mapping follows the tool contract of our own MCP endpoint (docs/mcp.md):

* ``verb[text]`` calls tool ``verb`` with ``text`` as its one required string argument;
* a reply that is a tool's name calls that tool when it requires no argument;
* anything else goes to tool ``act`` (its one string argument);
* with none of these, or when the tool answers an error, the action is invalid (a spent turn).

The tools are listed once per client (a ``ListToolsAction`` step, which changes no state).
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentgym.contract.errors import InvalidAction

_TYPED = re.compile(r"(?P<verb>[A-Za-z_][\w-]*)\[(?P<text>.*)\]", re.DOTALL)
FALLBACK_TOOL = "act"


def is_tool_action(action_schema: dict[str, Any]) -> bool:
    """Whether an env's action schema (from ``/schema``) is OpenEnv's ``CallToolAction``."""
    return {"tool_name", "arguments"} <= set(action_schema.get("properties", {}))


def tool_signatures(listed: dict[str, Any]) -> dict[str, list[str]]:
    """Tool name -> its required argument names, from a ``ListToolsObservation``'s fields."""
    return {
        tool["name"]: list((tool.get("input_schema") or {}).get("required", []))
        for tool in listed.get("tools", [])
    }


def tool_call(action: str, tools: dict[str, list[str]]) -> dict[str, Any]:
    """The ``CallToolAction`` data that plays the reply ``action``; InvalidAction when none does."""
    text = action.strip()
    typed = _TYPED.fullmatch(text)
    if typed and len(tools.get(typed["verb"], [])) == 1:
        return _call(typed["verb"], {tools[typed["verb"]][0]: typed["text"]})
    if text in tools and not tools[text]:
        return _call(text, {})
    if len(tools.get(FALLBACK_TOOL, [])) == 1:
        return _call(FALLBACK_TOOL, {tools[FALLBACK_TOOL][0]: text})
    raise InvalidAction(f"{text!r} names no tool of this env; its tools: {', '.join(sorted(tools))}")


def _call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {"type": "call_tool", "tool_name": name, "arguments": arguments}


def tool_result_text(fields: dict[str, Any]) -> str:
    """The text of a ``CallToolObservation`` (its ``tool_name``, ``result`` and ``error``
    popped from ``fields``); a tool error is an invalid action. A result holding v1's step
    fields (``observation`` text, ``info``) gives its text, and its ``info`` is left in
    ``fields["info"]`` (OpenEnv sends no observation metadata)."""
    fields.pop("tool_name", None)
    error, result = fields.pop("error", None), fields.pop("result", None)
    if error:
        raise InvalidAction(f"the tool failed ({error.get('error_type')}): {error.get('message')}")
    if not isinstance(result, dict):
        return "" if result is None else str(result)
    texts = [c.get("text", "") for c in result.get("content") or [] if c.get("type") == "text"]
    if result.get("is_error"):
        raise InvalidAction("the tool failed: " + " ".join(texts))
    data = result.get("data")
    if isinstance(data, dict) and isinstance(data.get("observation"), str):
        fields["info"] = data.get("info") if isinstance(data.get("info"), dict) else {}
        return data["observation"]
    if isinstance(data, str):
        return data
    return "\n".join(texts) if texts else json.dumps(result.get("structured_content") or result.get("data"))
