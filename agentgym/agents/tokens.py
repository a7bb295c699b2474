"""Exact token accounting for one episode of a token-level policy.

The context a model sees is built incrementally and never re-tokenized:

* start: ``tokenize(chat_template([system, first observation], add_generation_prompt=True))``;
* each turn: the generated ids as sampled (loss 1, one behaviour log-prob each), then the
  ids of the observation *delta* (loss 0): the text the chat template puts between the end
  of an assistant turn and the start of the next assistant turn.

The delta is rendered in a fixed base conversation ``[system, user, assistant, user(obs)]``
and cut after the assistant's content, so it is exactly what the template writes there
(end-of-turn, the user header, the observation, the assistant header), whatever the
conversation so far. When the generation already ended with the end-of-turn token that
opens the delta, that token's text is dropped. At the end of an episode
:meth:`TokenContext.drifted` re-renders the whole conversation and compares: templates that
rewrite earlier turns (strip reasoning, trim whitespace) make the recorded ids differ
from what a fresh render would give, and the trajectory is flagged.
"""

from __future__ import annotations

import logging
from typing import Any

from agentgym.agents.base import Message

log = logging.getLogger(__name__)

_BASE = [
    {"role": "system", "content": "S"},
    {"role": "user", "content": "U"},
]
_SENTINEL = "\u2063AGENTGYM-ASSISTANT-END\u2063"
"""Assistant content of the base conversation; the delta starts right after it."""
_warned_templates: set[int] = set()
"""Hashes of chat templates already warned about (warn once per template and process)."""


def encode(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` as-is: the chat template already wrote every special token."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render(tokenizer: Any, messages: list[Message], generation_prompt: bool = True) -> str:
    return tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in messages],
        tokenize=False,
        add_generation_prompt=generation_prompt,
    )


def observation_delta(tokenizer: Any, observation: str, last_generated: int | None) -> str:
    """The template's text between an assistant reply and the next reply's first token,
    minus the end-of-turn token text when ``last_generated`` (the reply's last sampled
    token) already is that token."""
    assistant = {"role": "assistant", "content": _SENTINEL}
    full = render(tokenizer, [*_BASE, assistant, {"role": "user", "content": observation}])
    cut = full.find(_SENTINEL)
    if cut < 0:
        raise ValueError("the chat template drops assistant messages; cannot build an incremental context")
    delta = full[cut + len(_SENTINEL) :]
    if last_generated is not None and last_generated in tokenizer.all_special_ids:
        emitted = tokenizer.convert_ids_to_tokens(last_generated)
        if delta.startswith(emitted):
            delta = delta[len(emitted) :]
    return delta


NOT_SAMPLED = -1
"""The version recorded on tokens no policy sampled (prompt, observations), and on sampled
tokens of backends that do not report versions."""


def sampled_versions(versions: list[int] | None, loss_mask: list[int] | None) -> list[int]:
    """The versions on sampled tokens (loss mask 1), in order; none without versions."""
    if versions is None:
        return []
    return [v for v, sampled in zip(versions, loss_mask or (), strict=True) if sampled]


def oldest_version(versions: list[int] | None) -> int | None:
    """The oldest weights version among sampled tokens (None: none, or none recorded)."""
    return min((v for v in versions or () if v != NOT_SAMPLED), default=None)


class TokenContext:
    """The token sequence of one episode: ``ids``, ``loss_mask`` (1 on generated tokens),
    ``logprobs`` (the behaviour log-prob on generated tokens, 0.0 elsewhere) and
    ``versions`` (the policy weights version that sampled each generated token, -1
    elsewhere and where the backend does not know), always of equal length; and
    ``reply_choices``, one entry per agent turn: the token sequences a constrained reply
    was allowed to become ([] for a free reply). ``ids`` is exactly the context of the
    next generation."""

    def __init__(self, tokenizer: Any, system: str, first_observation: str) -> None:
        self.tokenizer = tokenizer
        messages = [{"role": "system", "content": system}, {"role": "user", "content": first_observation}]
        self.ids: list[int] = encode(tokenizer, render(tokenizer, messages))
        self.loss_mask: list[int] = [0] * len(self.ids)
        self.logprobs: list[float] = [0.0] * len(self.ids)
        self.versions: list[int] = [NOT_SAMPLED] * len(self.ids)
        self.reply_choices: list[list[list[int]]] = []
        self.generated_tokens = 0
        self._last_generated: int | None = None
        self._checkpoint = (2, len(self.ids))
        """(messages, ids) at the last point where ids == a render ending in a generation prompt."""

    def add_generation(
        self,
        token_ids: list[int],
        logprobs: list[float],
        versions: list[int] | None = None,
        choices: list[list[int]] | None = None,
    ) -> None:
        """Append one reply's sampled tokens with their behaviour log-probs, weights versions
        (``None``: unknown, recorded as -1) and the replies it was constrained to (``None``:
        a free reply)."""
        if len(token_ids) != len(logprobs):
            raise ValueError(f"{len(token_ids)} generated tokens but {len(logprobs)} log-probs")
        if versions is not None and len(versions) != len(token_ids):
            raise ValueError(f"{len(token_ids)} generated tokens but {len(versions)} versions")
        self.ids += token_ids
        self.loss_mask += [1] * len(token_ids)
        self.logprobs += [float(lp) for lp in logprobs]
        self.versions += (
            [int(v) for v in versions] if versions is not None else [NOT_SAMPLED] * len(token_ids)
        )
        self.reply_choices.append([list(choice) for choice in choices or ()])
        self.generated_tokens += len(token_ids)
        self._last_generated = token_ids[-1] if token_ids else None

    def add_observation(self, observation: str, n_messages: int) -> None:
        """Append the delta of ``observation``; ``n_messages`` counts the conversation's
        messages with this observation included."""
        delta = encode(self.tokenizer, observation_delta(self.tokenizer, observation, self._last_generated))
        self.ids += delta
        self.loss_mask += [0] * len(delta)
        self.logprobs += [0.0] * len(delta)
        self.versions += [NOT_SAMPLED] * len(delta)
        self._last_generated = None
        self._checkpoint = (n_messages, len(self.ids))

    def drifted(self, messages: list[Message]) -> bool:
        """Whether re-rendering ``messages`` (up to the last observation appended) gives
        other tokens than were recorded. A difference only in how the model's own text
        splits into tokens (sampling may pick a non-canonical split) is not drift: then
        the recorded ids still decode to the rendered text."""
        n_messages, n_ids = self._checkpoint
        text = render(self.tokenizer, messages[:n_messages])
        recorded = self.ids[:n_ids]
        if encode(self.tokenizer, text) == recorded:
            return False
        seen = self.tokenizer.decode(recorded, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if seen == text:
            return False
        template = hash(self.tokenizer.chat_template)
        if template not in _warned_templates:
            _warned_templates.add(template)
            log.warning(
                "the chat template does not preserve earlier turns: re-rendering a conversation "
                "differs from the tokens the model saw; trajectories are marked template_drift "
                "and record what the model saw"
            )
        return True
