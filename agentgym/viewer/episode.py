"""Turn a trajectory record into what the episode view shows: turns and token runs.

Turn ``i`` is the ``i``-th assistant reply with the observation it answered (the user
message before it), the thought and action read from it, and ``rewards[i]``. Token-level
records also get their token sequence cut into runs of equal ``loss_mask``: the ``i``-th
trained run is the ``i``-th reply's sampled tokens (the record's invariant), so each turn
carries its tokens and their behaviour log-probs. Token text needs a tokenizer
(:mod:`agentgym.viewer.tokens`); without one tokens show as their ids.
"""

from __future__ import annotations

import json
import re
from typing import Any

from agentgym.viewer.tokens import TokenDecoder

THOUGHT_RE = re.compile(r"Thought:\s*(.*?)\s*(?:\nAction:|$)", re.S)


def check_record(record: dict[str, Any]) -> None:
    """``ValueError`` unless ``record`` has the shapes :func:`episode_view` reads:
    ``messages`` a list of ``{"role", "content"}`` strings, ``actions`` and ``rewards``
    lists, ``token_ids`` integers with ``loss_mask`` and ``logprobs`` numbers of the same
    length (each may be absent or empty when there are no tokens)."""
    messages = record.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError("messages must be a list of {role, content} strings")
    for key in ("actions", "rewards"):
        if not isinstance(record.get(key, []), list):
            raise ValueError(f"{key} must be a list")
    ids = record.get("token_ids") or []
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError("token_ids must be a list of integers")
    for key in ("loss_mask", "logprobs"):
        values = record.get(key) or []  # empty or absent: the view fills in defaults
        if values and (not isinstance(values, list) or len(values) != len(ids)):
            raise ValueError(f"{key} must have one entry per token ({len(ids)})")
        if not all(isinstance(v, int | float) for v in values):
            raise ValueError(f"{key} must hold numbers")


def thought_of(reply: str, agent_format: str) -> str | None:
    """The reasoning part of a reply (react ``Thought:``, json ``"thought"``); ``None`` if absent."""
    if agent_format == "json":
        try:
            parsed = json.loads(reply)
        except ValueError:
            return None
        thought = parsed.get("thought") if isinstance(parsed, dict) else None
        return str(thought) if thought else None
    match = THOUGHT_RE.search(reply) if agent_format == "react" else None
    return match.group(1) if match else None


def token_runs(record: dict[str, Any], decoder: TokenDecoder | None) -> list[dict[str, Any]]:
    """``[{"trained", "tokens": [{"id", "text", "logprob"}]}]``: maximal runs of equal loss mask.
    ``text`` is ``None`` without a tokenizer; ``logprob`` is ``None`` on untrained tokens
    (the record stores 0.0 there, which is no log-prob)."""
    ids = record.get("token_ids") or []
    mask = record.get("loss_mask") or [0] * len(ids)
    logprobs = record.get("logprobs") or [0.0] * len(ids)
    texts = decoder.pieces(ids) if decoder else [None] * len(ids)
    runs: list[dict[str, Any]] = []
    for token_id, trained, logprob, text in zip(ids, mask, logprobs, texts, strict=True):
        if not runs or runs[-1]["trained"] != bool(trained):
            runs.append({"trained": bool(trained), "tokens": []})
        runs[-1]["tokens"].append({"id": token_id, "text": text, "logprob": logprob if trained else None})
    return runs


def build_turns(record: dict[str, Any], runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per assistant reply: observation, reply, thought, action, reward, tokens."""
    messages = record.get("messages", [])
    trained_runs = [run["tokens"] for run in runs if run["trained"]]
    rewards, actions = record.get("rewards", []), record.get("actions", [])
    turns: list[dict[str, Any]] = []
    observation = None
    for message in messages:
        if message["role"] != "assistant":
            observation = message["content"] if message["role"] == "user" else observation
            continue
        i = len(turns)
        tokens = trained_runs[i] if i < len(trained_runs) else None
        logprobs = [t["logprob"] for t in tokens] if tokens else []
        turns.append(
            {
                "index": i,
                "observation": observation,
                "reply": message["content"],
                "thought": thought_of(message["content"], record.get("format", "react")),
                # An errored episode may have one reply more than it has actions/rewards.
                "action": actions[i] if i < len(actions) else None,
                "reward": rewards[i] if i < len(rewards) else None,
                "tokens": tokens,
                "mean_logprob": sum(logprobs) / len(logprobs) if logprobs else None,
            }
        )
        observation = None
    return turns


def episode_view(
    summary: dict[str, Any], record: dict[str, Any], decoder: TokenDecoder | None
) -> dict[str, Any]:
    """The ``/api/episodes/{id}`` body: the summary, system prompt, turns, the observation
    after the last reply, and the full token sequence as runs (empty for text policies)."""
    runs = token_runs(record, decoder)
    messages = record.get("messages", [])
    last = messages[-1] if messages else None
    return {
        **summary,
        "turn_count": summary["turns"],  # "turns" below is the list of turns
        "format": record.get("format"),
        "error": record.get("error"),
        "template_drift": record.get("template_drift", False),
        "generated_tokens": record.get("generated_tokens"),
        "timings": record.get("timings", {}),
        "system": next((m["content"] for m in messages if m["role"] == "system"), None),
        "turns": build_turns(record, runs),
        "final_observation": last["content"] if last and last["role"] == "user" else None,
        "token_runs": runs,
        "tokenizer": decoder.name if decoder else None,
    }
