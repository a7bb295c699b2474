"""Policies: hf (local transformers), openai (any chat-completions endpoint), vllm (GPU), expert.

``make_policy(kind, **kwargs)`` builds one by name. Backends are imported on demand, so
importing this package needs neither torch nor vllm.
"""

from __future__ import annotations

import importlib
from typing import Any

from agentgym.policies.base import Generation, GenerationRequest, Message, Policy, SamplingParams

POLICY_KINDS: dict[str, tuple[str, str]] = {
    "hf": ("agentgym.policies.hf", "HFPolicy"),
    "openai": ("agentgym.policies.openai", "OpenAIPolicy"),
    "vllm": ("agentgym.policies.vllm", "VLLMPolicy"),
    "expert": ("agentgym.policies.expert", "ExpertPolicy"),
}
"""``kind`` -> (module, class) of each backend."""
CONSTRAINING_KINDS = ("hf", "vllm", "openai")
"""The backends that decode under ``info["reply_choices"]``: hf and vllm by token-level
action masking; openai sends them as vLLM's ``structured_outputs.choice``, which
``serve-model`` enforces by the same rule (a vLLM server by its own choice backend)."""


def make_policy(kind: str, **kwargs: Any) -> Policy:
    """Build the policy ``kind`` (``hf``, ``openai``, ``vllm`` or ``expert``) with the
    backend's own keyword arguments, e.g. ``make_policy("hf", model="smollm2-135m")``."""
    if kind not in POLICY_KINDS:
        raise ValueError(f"unknown policy kind {kind!r}; choose one of {', '.join(POLICY_KINDS)}")
    module, cls = POLICY_KINDS[kind]
    return getattr(importlib.import_module(module), cls)(**kwargs)


__all__ = [
    "CONSTRAINING_KINDS",
    "POLICY_KINDS",
    "Generation",
    "GenerationRequest",
    "Message",
    "Policy",
    "SamplingParams",
    "make_policy",
]
