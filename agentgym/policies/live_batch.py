"""The rows a :class:`~agentgym.policies.batching.ContinuousBatcher` generates for, and the
batches they share: on the model's own left-padded cache (a prefill's) or on static slots,
each with the operations the batcher runs on it, and what records which weights computed what.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from agentgym.policies.base import SamplingParams
from agentgym.policies.chat import next_choice_tokens

if TYPE_CHECKING:
    from agentgym.policies.slots import Forward, SlotCache


@dataclass(eq=False)
class Row:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: Future
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    """Per sampled token: the weights version of the forward that gave its logits."""
    logits_version: int = 0
    """The weights version of the forward that computed this row's current logits."""
    text: str | None = None
    """Set when a stop string cut the reply: the text before it."""
    kv_version: int | None = None
    """The weights version of every forward that wrote this row's cache, or -1 if they
    differed (then the cache is not reusable)."""
    choices: list[list[int]] | None = None
    """Constrained rows: the token sequences the reply may become (each ends with a stop
    id); None: any reply."""

    def allowed_next(self) -> list[int] | None:
        """Constrained rows: the tokens that keep the reply on one of its choices."""
        return None if self.choices is None else next_choice_tokens(self.choices, self.token_ids)

    @property
    def last_position(self) -> int:
        """Position id of the newest token (the next decode input)."""
        return len(self.prompt_ids) + len(self.token_ids) - 1


@dataclass
class LiveBatch:
    """Rows decoding together and their next-token logits; how their keys and values are
    held is the subclass's: :class:`PaddedBatch` or :class:`SlottedBatch`."""

    rows: list[Row]
    logits: torch.Tensor
    """``[B, V]`` next-token logits of every row."""

    def room(self, max_rows: int) -> int:
        """How many newcomers may join before the next decode."""
        raise NotImplementedError

    def row_cache(self, index: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        """Row ``index``'s keys and values (``length`` tokens), per layer, to reuse as a
        prefix; None when they cannot be reused."""
        raise NotImplementedError

    def keep(self, keep: list[int]) -> LiveBatch:
        """Only rows ``keep`` (increasing)."""
        raise NotImplementedError

    def decode(self, forward: Forward, tokens: torch.Tensor) -> LiveBatch:
        """Feed each row its sampled token: the batch with the next logits."""
        raise NotImplementedError


@dataclass
class PaddedBatch(LiveBatch):
    """Rows on the model's own cache, left-padded to one length: a prefill's, or a model
    whose cache cannot be slotted (then newcomers wait until the batch drains)."""

    cache: Any
    mask: torch.Tensor
    """``[B, T]`` attention mask over the cache: 0 on padding."""

    def room(self, max_rows: int) -> int:
        return 0

    def row_cache(self, index: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        if not slottable(self.cache):
            return None
        columns = self.mask[index].nonzero().flatten()  # the real columns, not the padding
        return [(layer.keys[index : index + 1, :, columns], layer.values[index : index + 1, :, columns])
                for layer in self.cache.layers]  # fmt: skip

    def keep(self, keep: list[int]) -> PaddedBatch:
        return select(self, keep)

    def decode(self, forward: Forward, tokens: torch.Tensor) -> PaddedBatch:
        mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
        at = torch.tensor([row.last_position for row in self.rows], device=mask.device)[:, None]
        cache, logits = forward(tokens[:, None], mask, at, self.cache)
        return PaddedBatch(self.rows, logits, cache, mask)


@dataclass
class SlottedBatch(LiveBatch):
    """Rows on static slots (:class:`~agentgym.policies.slots.SlotCache`): row ``i`` is
    slot ``i``, newcomers take the free slots after them."""

    slots: SlotCache

    def room(self, max_rows: int) -> int:
        return max_rows - len(self.rows)

    def row_cache(self, index: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]] | None:
        return self.slots.row(index, length)

    def keep(self, keep: list[int]) -> SlottedBatch:
        # Up to every token a row has (the newest may not be written yet: copying one
        # column too many is harmless, the next step writes it before anything reads it).
        self.slots.keep(keep, [self.rows[i].last_position + 1 for i in keep])
        return SlottedBatch([self.rows[i] for i in keep], self.logits[keep], self.slots)

    def decode(self, forward: Forward, tokens: torch.Tensor) -> SlottedBatch:
        logits = self.slots.decode(forward, tokens, [row.last_position for row in self.rows])
        return SlottedBatch(self.rows, logits, self.slots)


def allowed_tokens(rows: list[Row], logits: torch.Tensor) -> torch.Tensor | None:
    """``[B, V]`` the tokens each row may draw next; None when no row is constrained."""
    nexts = [row.allowed_next() for row in rows]
    if all(tokens is None for tokens in nexts):
        return None
    # Built with two indexing calls, not two per row: on a GPU each call is a launch.
    constrained = [i for i, tokens in enumerate(nexts) if tokens is not None]
    rows = [i for i in constrained for _ in nexts[i]]
    columns = [token for i in constrained for token in nexts[i]]
    allowed = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    allowed[_indices(constrained, logits.device)] = False
    allowed[_indices(rows, logits.device), _indices(columns, logits.device)] = True
    return allowed


def _indices(values: list[int], device: torch.device) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long, device=device)


def started(rows: list[Row]) -> list[Row]:
    """Drop requests whose caller gave up (cancelled) before they started."""
    return [row for row in rows if row.future.set_running_or_notify_cancel()]


def stamp(rows: list[Row], version: int) -> None:
    """Record which weights computed the rows' next-token logits (and wrote their cache).
    Called right after a forward, under :attr:`ContinuousBatcher.lock`, so ``version`` is
    exactly the weights that forward used, even when an update lands before the token is
    sampled."""
    for row in rows:
        row.logits_version = version
        row.kv_version = version if row.kv_version in (None, version) else -1


def fail(row: Row, exc: BaseException) -> None:
    if not row.future.done():
        row.future.set_exception(exc)


def slottable(cache: Any) -> bool:
    """Only plain full-attention dynamic layers can be copied into slots (or reused)."""
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def select(live: PaddedBatch, keep: list[int], rows: list[Row] | None = None) -> PaddedBatch:
    """Keep rows ``keep`` (an index may repeat: the row is copied), as ``rows`` if given;
    drop cache columns that are padding in every remaining row."""
    index = torch.tensor(keep, device=live.mask.device)
    live.cache.batch_select_indices(index)
    mask = live.mask[index]
    if slottable(live.cache):
        first = int(mask.any(dim=0).int().argmax())
        if first > 0:
            mask = mask[:, first:]
            for layer in live.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    kept = [live.rows[i] for i in keep] if rows is None else rows
    return PaddedBatch(kept, live.logits[index], live.cache, mask)


def left_padded(sequences: list[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequences`` as ``[B, width]`` ids aligned right (left-padded with ``pad_id``) and
    the matching attention mask (0 on padding)."""
    width = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, sequence in enumerate(sequences):
        ids[i, width - len(sequence) :] = torch.tensor(sequence)
        mask[i, width - len(sequence) :] = 1
    return ids, mask


def pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
