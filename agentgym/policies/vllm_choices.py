"""Constrained replies inside vLLM's engine: a logits processor that lets a request's reply
become only one of its token sequences (``SamplingParams.extra_args["reply_choices"]``).

It is the hf batcher's action masking (:mod:`agentgym.policies.live_batch`) in vLLM's
sampler: at each step, the tokens that keep the reply on one of the choices still matching
what it has sampled, every other logit set to -inf. vLLM applies it before temperature, so
with ``logprobs_mode="processed_logprobs"`` the recorded log-prob of a token is
``log_softmax(logits / T)`` renormalised over the allowed tokens, as the hf backend records
it and the learner scores it. vLLM's structured outputs (``choice=``) are not used: they
allow any tokenisation that spells a choice, and the learner masks by the exact token
sequences the trajectory records.

Loaded by the engine process by name (``agentgym.policies.vllm.CHOICE_PROCESSOR``); it
imports vLLM, so only the engine imports this module.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from agentgym.policies.chat import next_choice_tokens
from agentgym.policies.vllm import CHOICES_ARG


class ChoiceLogitsProcessor(LogitsProcessor):
    """Masks each constrained request's logits to the next tokens of its remaining choices."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        choices = (sampling_params.extra_args or {}).get(CHOICES_ARG)
        if choices is None:
            return
        if not choices or not all(
            isinstance(choice, list) and choice and all(isinstance(t, int) for t in choice)
            for choice in choices
        ):
            raise ValueError(
                f"extra_args[{CHOICES_ARG!r}] must be a non-empty list of non-empty token-id lists"
            )

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[list[int]], list[int]]] = {}
        """Batch index -> (choices, the request's output token ids, a live reference)."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is likeliest

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, _choices_of)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (choices, output) in self.rows.items():
            allowed = next_choice_tokens(choices, output)
            if allowed:
                kept = logits[index, allowed].clone()
                logits[index] = float("-inf")
                logits[index, allowed] = kept
        return logits


def _choices_of(params: SamplingParams, _prompt: list[int] | None, output: list[int]) -> Any:
    choices = (params.extra_args or {}).get(CHOICES_ARG)
    return (choices, output) if choices else None
