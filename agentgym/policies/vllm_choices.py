"""Constrained replies inside vLLM's engine: a logits processor that lets a request's reply
become only one of its token sequences (``SamplingParams.extra_args["reply_choices"]``), or
of its text choices (``extra_args["agentgym_choices"]``, what an OpenAI-compatible client
sends a ``vllm serve`` through ``vllm_xargs``, whose values must be flat), each tokenized
here by the trainer's rule: alone, then the end of turn (:func:`~agentgym.policies.chat.reply_ids`).

It is the hf batcher's action masking (:mod:`agentgym.policies.live_batch`) in vLLM's
sampler: at each step, the tokens that keep the reply on one of the choices still matching
what it has sampled, every other logit set to -inf. vLLM applies it before temperature, so
with ``logprobs_mode="processed_logprobs"`` the recorded log-prob of a token is
``log_softmax(logits / T)`` renormalised over the allowed tokens, as the hf backend records
it and the learner scores it. vLLM's structured outputs (``choice=``) are not used: they
allow any tokenisation that spells a choice, and the learner masks by the exact token
sequences the trajectory records.

Loaded by the engine process by name (``agentgym.policies.vllm.CHOICE_PROCESSOR``; for a
server, ``vllm serve MODEL --logits-processors agentgym.policies.vllm_choices:ChoiceLogitsProcessor``);
it imports vLLM, so only the engine imports this module.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from agentgym.policies.chat import end_of_turn_id, next_choice_tokens, reply_ids
from agentgym.policies.vllm import CHOICE_TEXTS_ARG, CHOICES_ARG


class ChoiceLogitsProcessor(LogitsProcessor):
    """Masks each constrained request's logits to the next tokens of its remaining choices."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        args = sampling_params.extra_args or {}
        choices, texts = args.get(CHOICES_ARG), args.get(CHOICE_TEXTS_ARG)
        if choices is not None and not (
            isinstance(choices, list)
            and choices
            and all(isinstance(c, list) and c and all(isinstance(t, int) for t in c) for c in choices)
        ):
            raise ValueError(
                f"extra_args[{CHOICES_ARG!r}] must be a non-empty list of non-empty token-id lists"
            )
        if texts is not None and not (
            isinstance(texts, list) and texts and all(isinstance(t, str) and t for t in texts)
        ):
            raise ValueError(
                f"vllm_xargs[{CHOICE_TEXTS_ARG!r}] must be a non-empty list of non-empty strings"
            )

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self.rows: dict[int, tuple[list[list[int]], list[int]]] = {}
        """Batch index -> (choices, the request's output token ids, a live reference)."""
        self.tokenizer_name = vllm_config.model_config.tokenizer
        self._tokenizer: tuple[Any, int] | None = None
        """(tokenizer, end-of-turn id), loaded on the first text choices."""

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token is likeliest

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self.rows, batch_update, self._choices_of)

    def _choices_of(self, params: SamplingParams, _prompt: list[int] | None, output: list[int]) -> Any:
        args = params.extra_args or {}
        choices = args.get(CHOICES_ARG) or self._tokenized(args.get(CHOICE_TEXTS_ARG))
        return (choices, output) if choices else None

    def _tokenized(self, texts: list[str] | None) -> list[list[int]] | None:
        """Text choices as the token sequences the trainer's constrained decoding follows."""
        if not texts:
            return None
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_name)
            self._tokenizer = (tokenizer, end_of_turn_id(tokenizer))
        tokenizer, end_id = self._tokenizer
        return [reply_ids(tokenizer, text, end_id) for text in texts]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, (choices, output) in self.rows.items():
            allowed = next_choice_tokens(choices, output)
            if allowed:
                kept = logits[index, allowed].clone()
                logits[index] = float("-inf")
                logits[index, allowed] = kept
        return logits
