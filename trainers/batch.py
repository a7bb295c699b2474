"""From trajectories to training tensors, and per-token log-probs under the model.

Positions are aligned with the trajectory's tokens: ``logp[b, t]`` is the log-prob of
token ``t`` given the tokens before it (``logp[b, 0] = 0``, never an agent token since a
trajectory starts with the prompt). Batches are right-padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor


@dataclass
class TokenBatch:
    input_ids: Tensor
    """[B, T] token ids, right-padded."""
    attention_mask: Tensor
    """[B, T] 1 on real tokens."""
    loss_mask: Tensor
    """[B, T] 1 on agent (generated) tokens."""
    old_logp: Tensor
    """[B, T] behaviour log-probs on agent tokens, 0 elsewhere."""
    weights: Tensor
    """[B] per-episode scalars: advantages for RL, reward weights for AgentEvol."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def select(self, index: slice | Tensor) -> TokenBatch:
        return TokenBatch(
            *(
                t[index]
                for t in (self.input_ids, self.attention_mask, self.loss_mask, self.old_logp, self.weights)
            )
        )

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(
            *(
                t.to(device)
                for t in (self.input_ids, self.attention_mask, self.loss_mask, self.old_logp, self.weights)
            )
        )


def collate(trajectories: Sequence[dict[str, Any]], weights: Sequence[float], pad_id: int) -> TokenBatch:
    """Right-pad trajectory records into a batch. ``token_ids``, ``loss_mask`` and ``logprobs``
    have equal length (the trajectory format); ``logprobs`` matter on agent tokens only.
    Records without them (demonstrations) get zeros, which only behaviour cloning may use."""
    length = max(len(t["token_ids"]) for t in trajectories)
    batch = len(trajectories)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention, loss_mask, old_logp = (torch.zeros(batch, length) for _ in range(3))
    for row, record in enumerate(trajectories):
        n = len(record["token_ids"])
        input_ids[row, :n] = torch.tensor(record["token_ids"])
        attention[row, :n] = 1
        mask = torch.tensor(record["loss_mask"], dtype=torch.float)
        if mask.numel() != n:
            raise ValueError("a trajectory's loss_mask must have one entry per token")
        loss_mask[row, :n] = mask
        logprobs = record.get("logprobs")
        if logprobs:
            if len(logprobs) != n:
                raise ValueError("a trajectory's logprobs must have one entry per token (0 off agent tokens)")
            old_logp[row, :n] = torch.tensor(logprobs, dtype=torch.float) * mask
    return TokenBatch(
        input_ids, attention, loss_mask, old_logp, torch.tensor(list(weights), dtype=torch.float)
    )


def token_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Per-token ``log π(x_t | x_<t)`` at ``temperature`` (and the entropy of π at each
    position), aligned with ``input_ids``; column 0 is 0."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    picked = logp_all.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    zeros = torch.zeros_like(picked[:, :1])
    logp = torch.cat([zeros, picked], dim=1)
    if not with_entropy:
        return logp, None
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, torch.cat([zeros, entropy], dim=1)
