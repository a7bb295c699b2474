"""Next-token sampling with behaviour log-probs: pure tensor functions, one row per request.

The behaviour log-prob of a sampled token is ``log_softmax(logits / T)[token]``: the
distribution the token was drawn from, before nucleus truncation (as verl and TRL
record it). Greedy rows (``T == 0``) report the log-prob at ``T = 1``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    keys: torch.Tensor,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    Args:
        logits: ``[B, V]`` raw next-token logits.
        temperature: ``[B]``; ``0`` means greedy (argmax).
        top_p: ``[B]`` nucleus mass; ``1`` keeps the whole distribution.
        keys: ``[B, 3]`` from :func:`draw_keys`: each row's seed and how many tokens it
            has drawn; an unseeded row draws from torch's global generator.
        allowed: ``[B, V]`` bool, or None (every token): the tokens a row may draw. The
            draw is from the model's distribution renormalised over them (greedy: the
            likeliest of them), and the log-prob recorded is that of the renormalised
            distribution: constrained decoding is action masking, and the learner scores
            the token under the same mask (``trainers/batch.py``), so the policy it
            trains is the one that acted.

    Returns:
        ``(tokens [B] long, logprobs [B] float32)``.
    """
    logits = logits.float()
    greedy = temperature <= 0
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).to(logits)
    logp = torch.log_softmax(logits / scale[:, None], dim=-1)
    choice, best_of = logp, logits
    if allowed is not None:
        choice = torch.log_softmax(logp.masked_fill(~allowed, float("-inf")), dim=-1)
        best_of = logits.masked_fill(~allowed, float("-inf"))
    drawn = _draw(nucleus(choice.exp(), top_p.to(logits)), keys)
    tokens = torch.where(greedy.to(logits.device), best_of.argmax(dim=-1), drawn)
    return tokens, choice.gather(-1, tokens[:, None]).squeeze(-1)


def nucleus(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Zero every token outside the smallest set whose mass reaches ``top_p`` (per row);
    the result is unnormalised, which ``torch.multinomial`` accepts."""
    if bool((top_p >= 1).all()):
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    # Mass strictly before each token: the token that crosses top_p is kept.
    outside = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= top_p[:, None]
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``log_softmax(logits / T)[tokens]`` for ``logits [N, V]`` and ``tokens [N]``
    (``T <= 0`` counts as 1, matching :func:`sample_next` for greedy rows)."""
    scale = temperature if temperature > 0 else 1.0
    logp = torch.log_softmax(logits.float() / scale, dim=-1)
    return logp.gather(-1, tokens[:, None]).squeeze(-1)


UNSEEDED = -1
"""The first column of an unseeded row's key."""

_LOW32 = 0xFFFFFFFF


def draw_keys(seeds: Sequence[int | None], drawn: Sequence[int], device: torch.device) -> torch.Tensor:
    """The ``keys`` of :func:`sample_next`: per row its seed's low and high 32 bits and the
    number of tokens it has drawn before this one (``[B, 3]`` int64)."""
    rows = [
        [UNSEEDED, 0, 0] if seed is None else [seed & _LOW32, (seed >> 32) & _LOW32, count & _LOW32]
        for seed, count in zip(seeds, drawn, strict=True)
    ]
    return torch.tensor(rows, dtype=torch.long, device=device).reshape(-1, 3)


def _draw(probs: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draws, one uniform a row, in a fixed number of tensor operations: no
    per-row loop, no host sync, so a CUDA graph can capture it. A seeded row's uniform is a
    hash of (seed, tokens drawn), so a seed reproduces a reply whatever else shares the
    batch, on any device; unseeded rows take theirs from torch's global generator."""
    cdf = probs.double().cumsum(dim=-1)
    fresh = torch.rand(len(keys), dtype=torch.float64, device=probs.device)
    uniform = torch.where(keys[:, 0] == UNSEEDED, fresh, _hashed_uniform(keys))
    # The first token whose cumulative mass passes u: never one of probability 0.
    tokens = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)


def _hashed_uniform(keys: torch.Tensor) -> torch.Tensor:
    """A uniform in (0, 1) from each row's key: Mueller's 32-bit integer hash chained over
    the key's three words. Every product stays under 2**63, so int64 arithmetic is exact on
    every device."""
    mixed = _mix32(keys[:, 1])
    mixed = _mix32(mixed ^ keys[:, 0].clamp(min=0))
    mixed = _mix32(mixed ^ keys[:, 2])
    return (mixed.double() + 0.5) / 2.0**32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    x = ((x >> 16) ^ x) * 0x45D9F3B & _LOW32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _LOW32
    return (x >> 16) ^ x
