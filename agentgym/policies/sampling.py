"""Next-token sampling with behaviour log-probs: pure tensor functions, one row per request.

The behaviour log-prob of a sampled token is ``log_softmax(logits / T)[token]``: the
distribution the token was drawn from, before nucleus truncation (as verl and TRL
record it). Greedy rows (``T == 0``) report the log-prob at ``T = 1``.
"""

from __future__ import annotations

import torch


def sample_next(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    generators: list[torch.Generator | None],
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row.

    Args:
        logits: ``[B, V]`` raw next-token logits.
        temperature: ``[B]``; ``0`` means greedy (argmax).
        top_p: ``[B]`` nucleus mass; ``1`` keeps the whole distribution.
        generators: one per row; ``None`` uses torch's global generator.
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
    drawn = _draw(nucleus(choice.exp(), top_p.to(logits)), generators)
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


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    if all(generator is None for generator in generators):
        return torch.multinomial(probs, 1).squeeze(-1)
    # Seeded rows draw from their own generator so a seed reproduces a reply whatever
    # else shares the batch.
    return torch.cat(
        [
            torch.multinomial(row, 1, generator=generator)
            for row, generator in zip(probs, generators, strict=True)
        ]
    )
