"""From trajectories to training tensors, and per-token log-probs under the model.

Positions are aligned with the trajectory's tokens: ``logp[b, t]`` is the log-prob of
token ``t`` given the tokens before it (``logp[b, 0] = 0``, never an agent token since a
trajectory starts with the prompt). Batches are right-padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, NamedTuple

import torch
from torch import Tensor

from agentgym.policies.batching import last_position_only
from agentgym.policies.chat import next_choice_tokens
from agentgym.records.trajectory import Trajectory
from agentgym.trainers.algorithms import agent_turns, token_weights, turn_starts


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
    advantages: Tensor
    """[B, T] per agent token: the advantage for RL, the episode's weight for cloning."""
    token_weight: Tensor
    """[B, T] each agent token's weight in its minibatch's loss (:meth:`weighted`), so that
    summing ``w·loss`` over micro-batches and ranks gives the minibatch's loss exactly."""
    allowed: Tensor
    """[B, T, K] the token ids a constrained reply could have drawn at each agent token,
    padded with -1; all -1 where the token was drawn from the whole vocabulary."""
    position_ids: Tensor | None = None
    """[B, T] each token's position in its own episode where rows pack several episodes
    (:meth:`packed`); None: one episode a row, positions from the attention mask."""

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def _map(self, change: Any) -> TokenBatch:
        return TokenBatch(
            *(None if (t := getattr(self, f.name)) is None else change(t) for f in fields(self))
        )

    def select(self, index: slice | Tensor) -> TokenBatch:
        return self._map(lambda t: t[index])

    def trimmed(self) -> TokenBatch:
        """Drop the padding columns no row of this batch needs (micro-batches of short
        episodes must not pay for the longest episode of the whole minibatch)."""
        length = int(self.attention_mask.sum(-1).max())
        return self._map(lambda t: t[:, :length])

    def packed(self) -> TokenBatch:
        """This batch's episodes end to end in one row without padding, each with positions
        from 0. Given ``position_ids`` and no attention mask, transformers keeps each token's
        attention within its own episode (a block-diagonal causal mask), so every per-token
        figure is the unpacked one. An episode's first token is a prompt token, never scored:
        the hidden state before it belongs to the previous episode."""
        lengths = [int(n) for n in self.attention_mask.sum(-1)]
        row = self._map(lambda t: torch.cat([t[i, :n] for i, n in enumerate(lengths)])[None])
        return replace(row, position_ids=torch.cat([torch.arange(n) for n in lengths])[None])

    def by_length(self) -> Tensor:
        """Row indices from shortest to longest, so micro-batches group similar lengths."""
        return torch.argsort(self.attention_mask.sum(-1), stable=True)

    def to(self, device: torch.device | str) -> TokenBatch:
        return self._map(lambda t: t.to(device))

    def weighted(self, aggregation: str, norm_tokens: int | None = None) -> TokenBatch:
        """This batch as one minibatch: token weights from all of its agent tokens."""
        return replace(self, token_weight=token_weights(self.loss_mask, aggregation, norm_tokens=norm_tokens))


def per_token(advantage: float | Sequence[float], loss_mask: Sequence[int]) -> list[float]:
    """An episode's advantage on each of its tokens (0 off agent tokens): one number for the
    whole episode, or one per agent turn (a turn is a run of consecutive agent tokens)."""
    if isinstance(advantage, int | float):
        return [float(advantage) * m for m in loss_mask]
    turns = agent_turns(loss_mask)
    if turns != len(advantage):
        raise ValueError(f"{len(advantage)} per-turn advantages for an episode of {turns} agent turns")
    values, turn = [], -1
    for i, m in enumerate(loss_mask):
        turn += int(turn_starts(loss_mask, i))
        values.append(float(advantage[turn]) if m else 0.0)
    return values


def collate(
    trajectories: Sequence[dict[str, Any]], advantages: Sequence[float | Sequence[float]], pad_id: int
) -> TokenBatch:
    """Right-pad trajectory records into a batch. ``token_ids``, ``loss_mask`` and ``logprobs``
    have equal length (the trajectory format); ``logprobs`` matter on agent tokens only.
    Records without them (demonstrations) get zeros, which only behaviour cloning may use.
    ``advantages``: per episode, a number or one per agent turn (:func:`per_token`).
    ``reply_choices`` (optional, one entry per agent turn) give each constrained token the
    ids it was drawn among (:func:`allowed_at_positions`)."""
    length = max(len(t["token_ids"]) for t in trajectories)
    batch = len(trajectories)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention, loss_mask, old_logp, token_advantages = (torch.zeros(batch, length) for _ in range(4))
    for row, (record, advantage) in enumerate(zip(trajectories, advantages, strict=True)):
        n = len(record["token_ids"])
        input_ids[row, :n] = torch.tensor(record["token_ids"])
        attention[row, :n] = 1
        mask = torch.tensor(record["loss_mask"], dtype=torch.float)
        if mask.numel() != n:
            raise ValueError("a trajectory's loss_mask must have one entry per token")
        loss_mask[row, :n] = mask
        token_advantages[row, :n] = torch.tensor(per_token(advantage, record["loss_mask"]))
        logprobs = record.get("logprobs")
        if logprobs:
            if len(logprobs) != n:
                raise ValueError("a trajectory's logprobs must have one entry per token (0 off agent tokens)")
            old_logp[row, :n] = torch.tensor(logprobs, dtype=torch.float) * mask
    allowed = [
        allowed_at_positions(r["token_ids"], r["loss_mask"], r.get("reply_choices")) for r in trajectories
    ]
    width = max((len(ids) for rows in allowed for ids in rows.values()), default=1)
    allowed_ids = torch.full((batch, length, width), -1, dtype=torch.long)
    for row, positions in enumerate(allowed):
        for position, ids in positions.items():
            allowed_ids[row, position, : len(ids)] = torch.tensor(ids)
    weights = torch.zeros(batch, length)
    return TokenBatch(input_ids, attention, loss_mask, old_logp, token_advantages, weights, allowed_ids)


def allowed_at_positions(
    token_ids: Sequence[int],
    loss_mask: Sequence[int],
    reply_choices: Sequence[Sequence[Sequence[int]]] | None,
) -> dict[int, list[int]]:
    """Position -> the sorted token ids a constrained reply could draw there: the next
    tokens of the turn's choices that agree with the reply so far (as the sampler masked
    them). Free turns and records without ``reply_choices`` have none."""
    if not reply_choices:
        return {}
    starts = [i for i in range(len(loss_mask)) if turn_starts(loss_mask, i)]
    if len(starts) != len(reply_choices):
        raise ValueError(f"{len(reply_choices)} reply_choices entries for {len(starts)} agent turns")
    allowed: dict[int, list[int]] = {}
    for start, choices in zip(starts, reply_choices, strict=True):
        position = start
        while position < len(loss_mask) and loss_mask[position]:
            if not (tokens := next_choice_tokens(choices, token_ids[start:position])):
                break  # the reply is complete (or left its choices: nothing to mask by)
            allowed[position] = tokens
            position += 1
    return allowed


class TokenScores(NamedTuple):
    """Per-token scores of a batch, aligned with ``input_ids`` (0 where not computed)."""

    logp: Tensor
    """``log π(x_t | x_<t)``: under the constrained decoder's mask where there was one."""
    entropy: Tensor | None
    forced_end_logp: Tensor
    """Where a constrained reply's last token was forced (the end of a complete command, the
    only token allowed there): its log-prob under the model's own, unmasked distribution."""
    command_logmass: Tensor | None = None
    """Where the decoder held any other token of a reply to the turn's commands: the log of
    the probability the model's own, unmasked distribution gives the allowed ids there (how
    likely generation without the decoder stays on a command). None unless asked for."""

    def unaided_logp(self, forced_end_coef: float, command_mass_coef: float) -> Tensor:
        """The weighted log-likelihoods that keep the model acting without the constrained
        decoder (``TrainConfig.forced_end_coef``, ``command_mass_coef``), per token."""
        total = forced_end_coef * self.forced_end_logp
        return total if self.command_logmass is None else total + command_mass_coef * self.command_logmass


def sequence_logprobs(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    *,
    positions: Tensor | None = None,
    temperature: float = 1.0,
    with_entropy: bool = False,
    allowed: Tensor | None = None,
    position_ids: Tensor | None = None,
    with_command_mass: bool = False,
) -> TokenScores:
    """Per-token ``log π(x_t | x_<t)`` at ``temperature`` (and π's entropy there), aligned
    with ``input_ids``; 0 where not computed.

    ``allowed`` ([B, T, K] ids, -1 padded: :attr:`TokenBatch.allowed`) masks constrained
    tokens: π there is the model's distribution renormalised over the allowed ids, the
    distribution the sampler drew from, so log-probs, ratios and entropy are the acting
    policy's. A forced token's (one allowed id) log-prob is then 0 whatever the weights, so
    RL cannot move it; at a reply's end that is the token that stops generation, and
    ``forced_end_logp`` is its log-prob without the mask, for the term that keeps the model
    able to stop unaided (``TrainConfig.forced_end_coef``). ``with_command_mass`` adds
    ``command_logmass`` at the other constrained tokens, for the term that keeps the model
    on the commands unaided (``TrainConfig.command_mass_coef``).

    ``positions`` ([B, T], e.g. the loss mask) limits the work to those tokens: the output
    layer and the softmax over the vocabulary (49k entries for SmolLM2, the largest tensor
    of a step) then run on agent tokens only, not on the whole prompt.

    ``position_ids`` ([B, T]): rows that pack several episodes (:meth:`TokenBatch.packed`);
    the model then gets no attention mask and keeps attention within each episode.
    """
    if positions is None:
        positions = attention_mask.clone()
        positions[:, 0] = 0
    wanted = positions[:, 1:].bool()  # token t is predicted by the hidden state at t-1
    logits = head_logits(model, input_ids, attention_mask, position_ids, wanted)
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:][wanted][:, None]
    kept = None if allowed is None else vocabulary_mask(allowed[:, 1:][wanted], logits.shape[-1])
    forced_end, command_mass = unaided_scores(logits, targets, kept, wanted, with_command_mass)
    if kept is not None:
        logits = logits.masked_fill(~kept, float("-inf"))
    logp_all = torch.log_softmax(logits, dim=-1)
    entropy = None
    if with_entropy:
        finite = logp_all if kept is None else logp_all.masked_fill(~kept, 0.0)  # 0·(-inf) is nan
        entropy = -(logp_all.exp() * finite).sum(-1)
    picked = logp_all.gather(-1, targets).squeeze(-1)
    return TokenScores(
        *(
            None if row is None else aligned(row, wanted)
            for row in (picked, entropy, forced_end, command_mass)
        )
    )


def head_logits(
    model: torch.nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    wanted: Tensor,
) -> Tensor:
    """The output layer's float32 logits ([N, V]) at the ``wanted`` ([B, T-1]) positions
    only: the model's forward stops at the final hidden states."""
    where = {"attention_mask": attention_mask} if position_ids is None else {"position_ids": position_ids}
    # No KV cache: scoring never decodes, and transformers reads packed rows from
    # position_ids only when the forward has no cache.
    out = model(
        input_ids=input_ids,
        **where,
        use_cache=False,
        output_hidden_states=True,
        logits_to_keep=last_position_only(input_ids),
    )
    hidden = out.hidden_states[-1][:, :-1][wanted]  # the final (normed) layer, as lm_head sees it
    # A data-parallel wrapper (DDP, as accelerate wraps TRL's model) runs the forward but has
    # no output layer of its own: the head is its module's.
    wrapped = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    head = (model.module if wrapped else model).get_output_embeddings()
    # Under accelerate's mixed precision (TRL's model in bfloat16) the forward's outputs come
    # back in float32; the head takes its own dtype (an exact cast back).
    return head(hidden.to(head.weight.dtype)).float()


def unaided_scores(
    logits: Tensor, targets: Tensor, kept: Tensor | None, wanted: Tensor, with_command_mass: bool
) -> tuple[Tensor, Tensor | None]:
    """What the model does without the decoder's mask ([N] each, 0 where not computed): the
    free log-prob of each forced reply end, and (``with_command_mass``) the free mass on the
    allowed ids at every other constrained token."""
    forced_end = torch.zeros(targets.shape[0], dtype=logits.dtype, device=logits.device)
    command_mass = torch.zeros_like(forced_end) if with_command_mass else None
    if kept is None:
        return forced_end, command_mass
    ends = (wanted & ~torch.nn.functional.pad(wanted[:, 1:], (0, 1)))[wanted]  # a reply's last token
    at = ends & (kept.sum(-1) == 1)  # one row each: the free softmax costs next to nothing
    forced_end[at] = torch.log_softmax(logits[at], dim=-1).gather(-1, targets[at]).squeeze(-1)
    if command_mass is not None:
        held = ~kept.all(-1) & ~at
        command_mass[held] = log_allowed_mass(logits[held], kept[held])
    return forced_end, command_mass


def log_allowed_mass(logits: Tensor, kept: Tensor) -> Tensor:
    """``log Σ_{v kept} softmax(logits)_v`` per row ([N, V] logits and bool mask)."""
    return torch.logsumexp(logits.masked_fill(~kept, float("-inf")), dim=-1) - torch.logsumexp(logits, dim=-1)


def aligned(values: Tensor, wanted: Tensor) -> Tensor:
    """``values`` of the ``wanted`` positions ([B, T-1] bool) laid out as ``[B, T]`` (0 elsewhere)."""
    out = torch.zeros((wanted.shape[0], wanted.shape[1] + 1), dtype=values.dtype, device=values.device)
    out[:, 1:][wanted] = values
    return out


def vocabulary_mask(allowed: Tensor, vocabulary: int) -> Tensor | None:
    """``[N, V]`` bool from ``[N, K]`` allowed ids (-1 padded): every id of a row without
    any (a free token), only its ids otherwise; None when no row is constrained."""
    constrained = (allowed >= 0).any(-1)
    if not bool(constrained.any()):
        return None
    mask = torch.ones(allowed.shape[0], vocabulary, dtype=torch.bool, device=allowed.device)
    mask[constrained] = False
    rows, slots = (allowed >= 0).nonzero(as_tuple=True)
    mask[rows, allowed[rows, slots]] = True
    return mask


def token_record(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as a ``collate`` record."""
    return {
        "token_ids": trajectory.token_ids,
        "loss_mask": trajectory.loss_mask,
        "logprobs": trajectory.logprobs,
        "reply_choices": trajectory.reply_choices,
    }
