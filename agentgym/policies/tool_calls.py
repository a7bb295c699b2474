"""OpenAI tool calls for the chat-completions server, on models without a tool parser.

A request's ``tools`` are described to the model in a system message, with the reply shape
Hermes/Qwen-style models are trained on::

    <tool_call>
    {"name": "go", "arguments": {"argument": "north"}}
    </tool_call>

and the reply is read back into OpenAI's ``tool_calls``. ``tool_choice: "required"`` (or a
named function) also starts the reply with that opening, up to the function's name (or its
arguments), so a small model that would narrate is put on the call; ``"none"`` hides the
tools. Earlier assistant ``tool_calls`` are rendered in the same shape, and ``tool``
results become user turns (chat templates of small models often lack a tool role).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"


def function_names(tools: list[dict[str, Any]]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]


def named_choice(tool_choice: Any) -> str | None:
    """The function a ``{"type": "function", "function": {"name"}}`` choice names."""
    if isinstance(tool_choice, dict):
        return tool_choice.get("function", {}).get("name")
    return None


def tool_prompt(tools: list[dict[str, Any]], tool_choice: Any) -> str:
    """The system text that describes ``tools`` and how to call one."""
    described = "\n".join(json.dumps(tool["function"], ensure_ascii=False) for tool in tools)
    must = "You must call one function." if tool_choice == "required" else ""
    if name := named_choice(tool_choice):
        must = f"You must call the function {name}."
    return (
        f"You can call these functions:\n{described}\n"
        f'To call one, reply with exactly:\n{OPEN}\n{{"name": <function name>, "arguments": <arguments object>}}\n{CLOSE}\n'
        f"{must}"
    ).strip()


def forced_prefix(tool_choice: Any) -> str:
    """The start of the reply a required or named choice imposes ("" for auto)."""
    if name := named_choice(tool_choice):
        return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": '
    return f'{OPEN}\n{{"name": "' if tool_choice == "required" else ""


def render_call(name: str, arguments: str) -> str:
    """An earlier assistant tool call, in the shape the model is asked to write."""
    try:
        parsed: Any = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        parsed = arguments
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': parsed}, ensure_ascii=False)}\n{CLOSE}"


def parse_reply(text: str, names: list[str]) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a reply: the text before ``<tool_call>`` (None when
    empty) and the call in OpenAI's wire shape, when the reply holds one to a known
    function with an object of arguments; else ``(text, [])``."""
    head, found, rest = text.partition(OPEN)
    if not found:
        return text, []
    try:
        call, _ = json.JSONDecoder().raw_decode(rest.strip())
    except json.JSONDecodeError:
        return text, []
    arguments = call.get("arguments", {}) if isinstance(call, dict) else None
    if not isinstance(call, dict) or call.get("name") not in names or not isinstance(arguments, dict):
        return text, []
    wire = {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": call["name"], "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
    return head.strip() or None, [wire]
