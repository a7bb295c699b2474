"""The learner: the model being trained and everything that changes its weights.

It owns the trainable parameters (LoRA adapters or all weights), the optimizer, per-token
log-probs, the frozen KL reference, and one optimizer step whose loss is exactly the
minibatch's: every micro-batch contributes ``Σ w·loss`` with the token weights fixed on the
whole minibatch (``TokenBatch.weighted``), and gradients are summed over ranks. Every tensor
it computes with is moved to the model's device here, in :meth:`Learner.logprobs`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from agentgym.policies.adapters import adapt
from agentgym.policies.hf import HFPolicy
from agentgym.trainers.algorithms import Prepass
from agentgym.trainers.batch import TokenBatch, TokenScores, sequence_logprobs
from agentgym.trainers.distributed import DataParallel

PerTokenLoss = Callable[[TokenBatch], Tensor]
"""``f(micro-batch on the learner's device) -> [b, t]`` per-token losses."""


class Learner:
    def __init__(self, config: Any, policy: HFPolicy, dp: DataParallel) -> None:
        self.config = config
        self.policy = policy
        self.dp = dp
        self.device = policy.device
        # Adapters go into the policy's own modules, so in-process generation samples from
        # the weights being trained: no copy, no transfer.
        self.model = adapt(policy.model, config)
        self.trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.initial = [p.detach().clone() for p in self.trainable]
        """The weights before any training (AgentEvol learns from them every iteration)."""
        self.optimizer = torch.optim.AdamW(
            self.trainable, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.grad_norm = 0.0
        """The gradient norm of the last optimizer step, before clipping to ``max_grad_norm``."""
        self.reference: list[Tensor] | None = None
        """The KL reference: a frozen snapshot of the trainable weights (:meth:`take_reference`)."""
        self.reference_path: Path | None = None

    def set_learning_rate(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ----- log-probs -------------------------------------------------------------------

    def logprobs(
        self,
        batch: TokenBatch,
        *,
        temperature: float | None = None,
        with_entropy: bool = False,
        with_command_mass: bool = False,
    ) -> TokenScores:
        """Log-probs (and entropies, command masses: :class:`TokenScores`) of ``batch``'s agent
        tokens under the current weights, at the sampling temperature unless told otherwise;
        ``batch`` goes to the model's device."""
        batch = batch.to(self.device)
        return sequence_logprobs(
            self.model,
            batch.input_ids,
            batch.attention_mask,
            positions=batch.loss_mask,
            temperature=self.config.temperature if temperature is None else temperature,
            with_entropy=with_entropy,
            allowed=batch.allowed,
            position_ids=batch.position_ids,
            with_command_mass=with_command_mass,
        )

    def reference_logprobs(self, micro: TokenBatch) -> Tensor:
        if self.reference is None:
            raise RuntimeError("no KL reference taken: call take_reference first")
        with torch.no_grad(), swapped_weights(self.trainable, self.reference):
            return self.logprobs(micro)[0]

    def prepass(self, minibatch: TokenBatch, on_policy: bool = False) -> Prepass:
        """This rank's micro-batches of ``minibatch`` under the current weights, no gradient,
        one micro-batch at a time (a whole minibatch in one forward runs out of memory at
        real sizes); agent tokens only, flattened to ``[1, N]``. ``on_policy``: the current
        weights sampled every token, so their log-probs are the behaviour ones (the ratio is
        1 to float noise) and the forward is skipped."""
        parts: list[tuple[Tensor, ...]] = []
        with torch.no_grad():
            for index in self.dp.shard(self.micro_batches(minibatch)):
                micro = self.micro_batch(minibatch, index)
                agent = micro.loss_mask.bool()
                logp = micro.old_logp if on_policy else self.logprobs(micro)[0]
                parts.append((logp[agent], micro.old_logp[agent], micro.advantages[agent]))
        logp, old, advantages = (
            torch.cat([p[i] for p in parts])[None] if parts else torch.zeros(1, 0, device=self.device)
            for i in range(3)
        )
        return Prepass(logp, old, advantages, torch.ones_like(logp), self.dp.sum)

    def micro_batches(self, minibatch: TokenBatch) -> tuple[Tensor, ...]:
        """Row indices of each micro-batch: ``micro_batch_size`` episodes of similar length,
        or with ``pack_tokens`` the episodes that fill one packed row (:func:`pack`)."""
        order = minibatch.by_length()
        if self.config.pack_tokens:
            return pack(order, minibatch.attention_mask.sum(-1).long(), self.config.pack_tokens)
        return order.split(self.config.micro_batch_size)

    def micro_batch(self, minibatch: TokenBatch, index: Tensor) -> TokenBatch:
        """The micro-batch of rows ``index`` on the model's device: packed into one row, or
        right-padded rows trimmed to the longest."""
        rows = minibatch.select(index)
        return (rows.packed() if self.config.pack_tokens else rows.trimmed()).to(self.device)

    # ----- the optimizer step ----------------------------------------------------------

    def optimize(self, minibatch: TokenBatch, per_token_loss: PerTokenLoss) -> float:
        """One optimizer step on ``minibatch`` (weighted: :meth:`TokenBatch.weighted`):
        this rank's micro-batches each add ``Σ w·loss``, gradients are summed over ranks,
        clipped, applied. Returns the minibatch loss."""
        with self.policy.weights_lock:  # the policy's batcher never samples from half-updated weights
            self.model.train()
            self.optimizer.zero_grad(set_to_none=True)
            total = torch.zeros((), device=self.device)
            for index in self.dp.shard(self.micro_batches(minibatch)):
                micro = self.micro_batch(minibatch, index)
                loss = (per_token_loss(micro) * micro.token_weight).sum()
                loss.backward()
                total += loss.detach()
            self.dp.sum_gradients(self.trainable)
            self.grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable, self.config.max_grad_norm))
            self.optimizer.step()
            self.model.eval()
        return float(self.dp.sum(total))

    # ----- weights ---------------------------------------------------------------------

    def take_reference(self, path: Path) -> None:
        """Freeze the current trainable weights as the KL reference (the policy at the start
        of RL, after behaviour cloning), saved at ``path`` so a resumed run keeps it."""
        if self.reference_path == path:
            return
        if path.exists():
            saved = torch.load(path, weights_only=True)
            self.reference = [t.to(self.device) for t in saved]
        else:
            self.reference = [p.detach().clone() for p in self.trainable]
            if self.dp.main:
                staging = path.with_suffix(".tmp")
                torch.save([t.cpu() for t in self.reference], staging)
                staging.replace(path)
        self.reference_path = path

    def reset_to_initial(self) -> None:
        """Back to the weights before any training, with a fresh optimizer state."""
        with torch.no_grad():
            for parameter, value in zip(self.trainable, self.initial, strict=True):
                parameter.copy_(value)
        self.optimizer.state.clear()

    def named_trainable(self) -> list[tuple[str, Tensor]]:
        return [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]


@contextlib.contextmanager
def swapped_weights(parameters: Sequence[torch.nn.Parameter], values: Sequence[Tensor]) -> Iterator[None]:
    """Run the model with ``values`` in place of ``parameters`` (the KL reference), then put
    the current weights back. Autograd reads a parameter's data at backward time, after the
    swap has been undone, so a graph built before it stays right."""
    current = [p.data for p in parameters]
    try:
        for parameter, value in zip(parameters, values, strict=True):
            parameter.data = value
        yield
    finally:
        for parameter, data in zip(parameters, current, strict=True):
            parameter.data = data


def pack(order: Tensor, lengths: Tensor, capacity: int) -> tuple[Tensor, ...]:
    """``order``'s rows in packs of at most ``capacity`` tokens, longest first, each into
    the first pack with room (first-fit decreasing; a longer episode makes a pack alone).
    Deterministic: every rank forms the same packs."""
    packs: list[list[int]] = []
    room: list[int] = []
    for row in reversed(order.tolist()):
        n = int(lengths[row])
        fits = next((i for i, free in enumerate(room) if free >= n), None)
        if fits is None:
            packs.append([row])
            room.append(capacity - n)
        else:
            packs[fits].append(row)
            room[fits] -= n
    return tuple(torch.tensor(rows) for rows in packs)
