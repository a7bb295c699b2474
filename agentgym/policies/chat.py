"""Tokenizer helpers shared by the token-level backends (hf, vllm)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agentgym.policies.base import GenerationRequest, Message

END_OF_TURN_TOKENS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>")
"""Chat templates' end-of-turn markers; each one stops a reply when the tokenizer has it
as a special token (a model may end a turn with it even when its ``eos`` is another)."""


def chat_prompt_ids(tokenizer: Any, messages: list[Message]) -> list[int]:
    """The chat template applied to ``messages``, ending with the assistant's turn header."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    # transformers 5 returns a BatchEncoding here, 4.x a plain list.
    return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def stop_token_ids(tokenizer: Any, generation_config: Any = None) -> set[int]:
    """Token ids that end a reply: the tokenizer's and generation config's eos ids, plus
    any end-of-turn marker the tokenizer has as a special token."""
    ids: set[int] = set()
    for source in (tokenizer.eos_token_id, getattr(generation_config, "eos_token_id", None)):
        ids.update(source if isinstance(source, list) else [source] if source is not None else [])
    added = tokenizer.get_added_vocab()
    ids.update(added[token] for token in END_OF_TURN_TOKENS if token in added)
    if not ids:
        raise ValueError("the tokenizer defines no eos token; cannot tell where a reply ends")
    return ids


def end_of_turn_id(tokenizer: Any) -> int:
    """The token that closes an assistant turn in the chat template (its eos if none)."""
    ends = [t for t in END_OF_TURN_TOKENS if t in tokenizer.get_vocab()]
    return tokenizer.convert_tokens_to_ids(ends[0]) if ends else tokenizer.eos_token_id


def reply_ids(tokenizer: Any, text: str, end_id: int) -> list[int]:
    """``text`` tokenized as a whole assistant reply: its tokens, then ``end_id`` (the
    :func:`end_of_turn_id`, looked up once: the lookup reads the whole vocabulary)."""
    return [*tokenizer.encode(text, add_special_tokens=False), end_id]


def next_choice_tokens(choices: Sequence[Sequence[int]], reply: Sequence[int]) -> list[int]:
    """The tokens a constrained reply may draw after ``reply`` (its tokens so far): the next
    token of every choice (a whole reply's token ids) that ``reply`` begins, sorted; empty
    when the reply is complete or left every choice. The one rule the hf sampler, vLLM's
    logits processor and the learner's mask all follow."""
    position, reply = len(reply), list(reply)
    return sorted({c[position] for c in choices if len(c) > position and list(c[:position]) == reply})


def choice_ids(tokenizer: Any, request: GenerationRequest, end_id: int) -> list[list[int]] | None:
    """``request.info["reply_choices"]`` (the only replies allowed, as text) as the token
    sequences constrained decoding follows and the learner masks by; None: unconstrained."""
    choices = request.info.get("reply_choices")
    return [reply_ids(tokenizer, text, end_id) for text in choices] if choices else None
