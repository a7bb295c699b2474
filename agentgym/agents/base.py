"""What every agent format provides: the rules shown to the model, a strict parser for its
replies, the explanation sent back when a reply does not parse, and a renderer that turns
an action into a valid reply (used to write expert demonstrations in the same format)."""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, ClassVar

Message = dict[str, Any]
"""A chat message: ``{"role": "system" | "user" | "assistant", "content": str}`` (the
agent formats write them; policies read them)."""


@dataclass(frozen=True)
class ParsedReply:
    """The outcome of parsing one model reply: exactly one of ``action`` and ``error`` is set."""

    action: str | None = None
    """The command to send to the environment."""
    error: str | None = None
    """Why the reply was rejected, phrased for the model (one sentence, no trailing period)."""


def reject(error: str) -> ParsedReply:
    return ParsedReply(error=error)


def accept(action: str) -> ParsedReply:
    action = action.strip()
    return ParsedReply(action=action) if action else reject("the action is empty")


class AgentFormat(abc.ABC):
    """How the agent writes its replies. Subclasses set ``name`` and implement
    :meth:`rules`, :meth:`parse` and :meth:`render`; ``parse(render(a)).action == a`` for
    every one-line action ``a``."""

    name: ClassVar[str]

    @abc.abstractmethod
    def rules(self) -> str:
        """The reply format, stated for the model (appended to the system prompt)."""

    @abc.abstractmethod
    def parse(self, reply: str) -> ParsedReply:
        """Extract the action from ``reply``, or say exactly what is wrong with it. Never raises."""

    @abc.abstractmethod
    def render(self, action: str, thought: str | None = None) -> str:
        """A reply in this format that plays ``action``."""

    def system_prompt(self, instruction: str) -> str:
        """The environment's instruction followed by this format's rules. The rules come
        last and say they win, because env instructions may describe a bare-command reply."""
        return f"{instruction.strip()}\n\n{self.rules()}"

    def feedback(self, error: str) -> str:
        """The observation that replaces the environment's answer to an unparseable reply."""
        return (
            f"Invalid reply: {error}. Nothing was sent to the environment and the turn is used up.\n"
            f"{self.rules()}"
        )
