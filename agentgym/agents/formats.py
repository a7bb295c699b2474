"""The built-in agent formats: ReAct (default), JSON function call, and plain."""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from agentgym.agents.base import AgentFormat, ParsedReply, accept, reject

_ACTION_LINE = re.compile(r"^[ \t]*Action[ \t]*:(.*)$", re.MULTILINE)
_QUOTES = ("`", '"', "'")
_FENCE = re.compile(r"^```(?:json)?\s*\n?(.*?)\n?```$", re.DOTALL)


def _unquote(text: str) -> str:
    """Drop one pair of surrounding backticks or quotes (``go north`` -> go north)."""
    text = text.strip()
    for quote in _QUOTES:
        if len(text) >= 2 and text.startswith(quote) and text.endswith(quote):
            return text[1:-1].strip()
    return text


class ReActFormat(AgentFormat):
    """``Thought: ...`` then ``Action: ...``. The reply must hold exactly one line that
    starts with ``Action:``; the action is the rest of that line, or (AgentGym's layout,
    ``Action:\\n<command>``) the next non-empty line. ``Thought:`` is optional, and
    anything after the action's line is ignored (small models like to invent the next
    observation)."""

    name: ClassVar[str] = "react"

    def rules(self) -> str:
        return (
            "Reply in exactly this format, and nothing else:\n"
            "Thought: <one or two sentences of reasoning>\n"
            "Action: <exactly one command>\n"
            "(These format rules override any other instruction about how to reply.)"
        )

    def parse(self, reply: str) -> ParsedReply:
        matches = list(_ACTION_LINE.finditer(reply))
        if not matches:
            return reject("the reply has no line starting with 'Action:'")
        if len(matches) > 1:
            return reject(
                f"the reply has {len(matches)} lines starting with 'Action:'; exactly one is allowed"
            )
        action = matches[0].group(1).strip()
        if not action:
            following = reply[matches[0].end() :].strip()
            action = following.splitlines()[0] if following else ""
        return accept(_unquote(action))

    def render(self, action: str, thought: str | None = None) -> str:
        return f"Thought: {thought}\nAction: {action}" if thought else f"Action: {action}"


class JsonCallFormat(AgentFormat):
    """One JSON object, optionally inside a ```json fence and nothing else: either
    ``{"thought": "...", "action": "..."}`` (``thought`` optional) or a function call
    ``{"name": "act", "arguments": {"action": "..."}}`` whose ``arguments`` may also be a
    JSON-encoded string, as OpenAI tool calls carry them."""

    name: ClassVar[str] = "json"

    def rules(self) -> str:
        return (
            "Reply with one JSON object and nothing else, in exactly this form:\n"
            '{"thought": "<one or two sentences of reasoning>", "action": "<exactly one command>"}\n'
            "(These format rules override any other instruction about how to reply.)"
        )

    def parse(self, reply: str) -> ParsedReply:
        text = reply.strip()
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group(1).strip()
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            return reject(f"the reply is not valid JSON ({exc.msg} at character {exc.pos})")
        if not isinstance(obj, dict):
            return reject(f"the reply is a JSON {type(obj).__name__}, not an object")
        return self._action_of(obj)

    def _action_of(self, obj: dict[str, Any]) -> ParsedReply:
        if "name" in obj:
            if obj["name"] != "act":
                return reject(f'unknown function {obj["name"]!r}; the only function is "act"')
            arguments = obj.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except json.JSONDecodeError:
                    return reject('"arguments" is a string that is not valid JSON')
            if not isinstance(arguments, dict):
                return reject('a function call needs "arguments": {"action": "<command>"}')
            obj = arguments
        action = obj.get("action")
        if not isinstance(action, str):
            return reject('the object has no string field "action"')
        return accept(action)

    def render(self, action: str, thought: str | None = None) -> str:
        return json.dumps({"thought": thought, "action": action} if thought else {"action": action})


class PlainFormat(AgentFormat):
    """The whole reply is the action: one non-empty line (surrounding quotes dropped)."""

    name: ClassVar[str] = "plain"

    def rules(self) -> str:
        return (
            "Reply with exactly one command on a single line, and nothing else.\n"
            "(These format rules override any other instruction about how to reply.)"
        )

    def parse(self, reply: str) -> ParsedReply:
        lines = [line for line in reply.strip().splitlines() if line.strip()]
        if len(lines) > 1:
            return reject(f"the reply has {len(lines)} lines; reply with one command on one line")
        return accept(_unquote(lines[0]) if lines else "")

    def render(self, action: str, thought: str | None = None) -> str:
        return action
