"""The policy interface: a batch of conversations in; texts, sampled token ids and their
log-probs out.

Token-level backends (``hf``, ``vllm``) accept the exact context as token ids
(``GenerationRequest.prompt_ids``) so that a rollout never decodes and re-tokenizes a
turn that was already generated; they expose their ``tokenizer`` so the rollout can
tokenize observations incrementally. Text-level backends (``openai``, ``expert``) read
``messages`` and return text only (``token_ids``/``logprobs`` are ``None``): good for
evaluation, not for training.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from agentgym.agents.base import Message


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy. Behaviour log-probs are taken at this temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass (1.0 = off). Log-probs ignore the truncation, as in verl/TRL."""
    max_new_tokens: int = 128
    """Generated tokens per turn at most; a reply cut here ends with ``finish_reason="length"``."""
    stop: tuple[str, ...] = ()
    """Extra stop strings (the tokenizer's end-of-turn token always stops)."""
    seed: int | None = None
    """Seed for sampling, where the backend supports it."""


@dataclass
class GenerationRequest:
    messages: list[Message]
    """The conversation so far (always set; text backends use only this)."""
    prompt_ids: list[int] | None = None
    """Token backends: the exact context to continue (chat template already applied)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Harness-side data the backend may use (the ``expert`` policy reads ``expert_action``)."""


@dataclass
class Generation:
    text: str
    """The reply, decoded without special tokens."""
    token_ids: list[int] | None = None
    """Sampled token ids, including the end-of-turn token when the model emitted it."""
    logprobs: list[float] | None = None
    """One behaviour log-prob per sampled token."""
    finish_reason: str = "stop"
    """``stop`` (end-of-turn or a stop string) or ``length`` (hit ``max_new_tokens``)."""
    versions: list[int] | None = None
    """One policy weights version per sampled token (``None``: the backend does not know)."""
    choices: list[list[int]] | None = None
    """Constrained replies: the token sequences the reply was allowed to become (each
    ending with a stop id); ``logprobs`` are then under that mask. ``None``: a free reply."""
    tool_call: dict[str, str] | None = None
    """Text backends that acted through an OpenAI tool call: ``{"name", "arguments", "action"}``
    (``arguments`` as the JSON string the API sends, ``action`` the env command it stands for;
    :mod:`agentgym.agents.tools`). ``text`` is then the reply's content, if any."""


@runtime_checkable
class Policy(Protocol):
    name: str
    """Model id or alias, recorded in trajectories."""
    tokenizer: Any | None
    """A Hugging Face tokenizer for token-level backends, else ``None``."""

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """Answer every request (same order). Safe to call concurrently: backends batch
        requests arriving from many episodes together."""
        ...

    async def close(self) -> None:
        """Release the model / connections."""
        ...
