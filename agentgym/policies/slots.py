"""Static key/value slots for the continuous batcher's decode steps.

Each live row owns one *slot* of preallocated key and value tensors, and its token at
position ``p`` lives in column ``p`` of its slot: a decode step writes one column per row,
at that row's own position, and attends over a window of the first ``W`` columns, with
columns past each row's position masked. Nothing is concatenated, trimmed or reallocated
per token, so on CUDA a step's shapes depend only on two buckets, the batch and the window
(powers of two), and each ``(batch, window)`` step is captured once as a CUDA graph and
replayed: the decode loop is one launch per token instead of hundreds. Without graphs (on
CPU) the batch is the live rows and the window the longest row.

Rows are kept in slots ``0 .. rows-1``, so a step's tensors are views, never gathers: a
finished row's slot is filled by moving a later row down. Prompts are still encoded by
the batcher's eager prefill (their lengths vary); their keys and values are then copied
into free slots.

Weights must change in place (an optimizer step, ``load_state_dict``), as every path in
this project does: a captured graph reads the parameters at the addresses it saw.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache

log = logging.getLogger(__name__)

Forward = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, Any], tuple[Any, torch.Tensor]]
"""``forward(ids [B, 1], mask [B, 1, 1, W], positions [B, 1], cache) -> (cache, logits [B, V])``."""

MIN_CAPACITY = 256
"""Columns a slot starts with; with graphs capacity doubles when a row needs more, without
it grows in steps of this many."""


def batch_bucket(rows: int) -> int:
    """The smallest power of two that holds ``rows``."""
    return 1 << max(0, rows - 1).bit_length()


@dataclass
class _Graph:
    """One captured decode step and the buffers it reads and writes."""

    graph: Any
    ids: torch.Tensor
    positions: torch.Tensor
    logits: torch.Tensor


class SlotCache(Cache):
    """Keys and values of up to ``slots`` rows (a power of two), each at its own positions.

    Args:
        layers: the per-layer ``(keys, values)`` of a first prefill, ``[B, H, T, D]``: the
            slots take their heads, head size, dtype and device.
        slots: rows at most (rounded up to a power of two).
        max_capacity: columns a slot may grow to (the model's context), None: unbounded.
        graphs: capture decode steps as CUDA graphs (CUDA devices only).
    """

    def __init__(
        self,
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        slots: int,
        max_capacity: int | None = None,
        graphs: bool = False,
    ) -> None:
        super().__init__(layers=[])
        self.slots = batch_bucket(slots)
        self.max_capacity = max_capacity
        self.graphs = graphs
        self.rows = 0
        """Live rows, in slots ``0 .. rows-1``."""
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._shape = [(keys.shape[1], keys.shape[-1], values.shape[-1]) for keys, values in layers]
        self._like = layers[0][0]
        self._write: torch.Tensor | None = None
        self._index: dict[int, torch.Tensor] = {}
        self._batch = 0
        self._window = 0
        self._captured: dict[tuple[int, int], _Graph] = {}
        self._pool: Any = None
        self._grow(MIN_CAPACITY)

    # ----- what the model calls --------------------------------------------------------

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write each row's new key and value at its position; return the step's window."""
        keys, values = self.keys[layer_idx][: self._batch], self.values[layer_idx][: self._batch]
        rows = self._index[self._batch]
        keys[rows, :, self._write] = key_states[:, :, 0]
        values[rows, :, self._write] = value_states[:, :, 0]
        return keys[:, :, : self._window], values[:, :, : self._window]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.capacity

    # ----- rows in and out ---------------------------------------------------------------

    def admit(self, layers: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor) -> None:
        """Append the rows of a prefill (``layers``: per layer ``[N, H, T, D]``, ``mask``:
        ``[N, T]``, 0 on padding) to the next free slots, each row's real columns first.
        One gather a layer for all rows: on a GPU a copy per row and layer would cost more
        launches than the decode steps save."""
        count, first = len(mask), self.rows
        if first + count > self.slots:
            raise ValueError(f"{first + count} rows do not fit in {self.slots} slots")
        width = int(mask.sum(dim=-1).max())
        self.reserve(width)
        # Each row's real columns in order, then its padding (copied too, never read).
        source = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True)[:, :width]
        for layer, (keys, values) in enumerate(layers):
            self.keys[layer][first : first + count, :, :width] = _columns(keys, source)
            self.values[layer][first : first + count, :, :width] = _columns(values, source)
        self.rows += count

    def keep(self, keep: list[int], lengths: list[int]) -> None:
        """Keep rows ``keep`` (increasing), in that order; ``lengths``: the columns each
        holds. Rows move down into the first free slots, so live slots stay contiguous."""
        moves = [(slot, row) for slot, row in enumerate(keep) if row != slot]
        if moves:
            width = max(lengths[slot] for slot, _ in moves)
            targets = torch.tensor([slot for slot, _ in moves], device=self._like.device)
            sources = torch.tensor([row for _, row in moves], device=self._like.device)
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[targets, :, :width] = keys[sources, :, :width]  # the right side is a copy
                values[targets, :, :width] = values[sources, :, :width]
        self.rows = len(keep)

    def row(self, index: int, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A copy of the first ``length`` columns of row ``index``: per layer ``[1, H, length, D]``."""
        return [
            (keys[index : index + 1, :, :length].clone(), values[index : index + 1, :, :length].clone())
            for keys, values in zip(self.keys, self.values, strict=True)
        ]

    def reserve(self, columns: int) -> None:
        """Make every slot hold at least ``columns`` columns."""
        if columns > self.capacity:
            if self.max_capacity is not None and columns > self.max_capacity:
                raise ValueError(f"{columns} positions exceed the model's {self.max_capacity}")
            if self.graphs:  # few capacities: few recaptures
                size = self.capacity
                while size < columns:
                    size *= 2
            else:  # memory is all that matters: grow in steps
                size = (columns // MIN_CAPACITY + 1) * MIN_CAPACITY
            self._grow(size if self.max_capacity is None else min(size, self.max_capacity))

    def _grow(self, capacity: int) -> None:
        """Reallocate every slot with ``capacity`` columns, keeping what they hold; captured
        graphs read the old tensors, so they go."""
        old = self.capacity
        new_keys, new_values = [], []
        for layer, (heads, key_size, value_size) in enumerate(self._shape):
            keys = self._like.new_zeros((self.slots, heads, capacity, key_size))
            values = self._like.new_zeros((self.slots, heads, capacity, value_size))
            if old:
                keys[:, :, :old] = self.keys[layer]
                values[:, :, :old] = self.values[layer]
            new_keys.append(keys)
            new_values.append(values)
        self.keys, self.values, self.capacity = new_keys, new_values, capacity
        self._captured.clear()
        self._pool = None

    # ----- the decode step -----------------------------------------------------------------

    def decode(self, forward: Forward, tokens: torch.Tensor, positions: list[int]) -> torch.Tensor:
        """Feed every live row its next token (``tokens [rows]``, at ``positions``, host
        ints); the next-token logits ``[rows, V]``."""
        window = self._window_for(max(positions) + 1)
        graphs = self.graphs and tokens.device.type == "cuda"
        batch = batch_bucket(self.rows) if graphs else self.rows  # eager steps waste no rows
        ids = torch.zeros((batch, 1), dtype=torch.long, device=tokens.device)
        ids[: self.rows, 0] = tokens
        at = torch.zeros((batch, 1), dtype=torch.long)
        at[: self.rows, 0] = torch.tensor(positions)
        at = at.to(tokens.device)
        if graphs:
            graph = self._captured.get((batch, window)) or self._capture(forward, batch, window)
            if graph is not None:
                graph.ids.copy_(ids)
                graph.positions.copy_(at)
                graph.graph.replay()
                return graph.logits[: self.rows].clone()
        return self._step(forward, ids, at, window)[: self.rows]

    def _window_for(self, columns: int) -> int:
        """The attention window for rows as long as ``columns``: its bucket, within capacity."""
        # Graphs: few shapes, few captures. Eager: no shape is reused, so no column is wasted.
        window = max(MIN_CAPACITY, batch_bucket(columns)) if self.graphs else columns
        self.reserve(window if self.max_capacity is None else min(window, self.max_capacity))
        return min(window, self.capacity)

    def _step(
        self, forward: Forward, ids: torch.Tensor, positions: torch.Tensor, window: int
    ) -> torch.Tensor:
        """One decode forward of ``len(ids)`` rows over the first ``window`` columns."""
        batch = len(ids)
        if batch not in self._index:
            self._index[batch] = torch.arange(batch, device=ids.device)
        self._batch, self._window, self._write = batch, window, positions[:, 0]
        visible = torch.arange(window, device=ids.device)[None, :] <= positions
        dtype = self._like.dtype
        mask = torch.zeros(visible.shape, dtype=dtype, device=ids.device).masked_fill(
            ~visible, torch.finfo(dtype).min
        )
        return forward(ids, mask[:, None, None, :], positions, self)[1]

    def _capture(self, forward: Forward, batch: int, window: int) -> _Graph | None:
        """Capture the ``(batch, window)`` step; on failure decode eagerly from now on."""
        device = self._like.device
        ids = torch.zeros((batch, 1), dtype=torch.long, device=device)
        # Warm-up writes land in the window's last column, past every live row's position
        # (or at it, about to be written anyway), so no live key or value is touched.
        positions = torch.full((batch, 1), window - 1, dtype=torch.long, device=device)
        try:
            stream = torch.cuda.Stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for _ in range(2):  # lazy initialisation and autotuning happen outside the graph
                    self._step(forward, ids, positions, window)
            torch.cuda.current_stream(device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                logits = self._step(forward, ids, positions, window)
        except Exception:
            log.warning("CUDA graph capture failed; decoding eagerly", exc_info=True)
            self.graphs = False
            return None
        self._pool = graph.pool()
        self._captured[(batch, window)] = _Graph(graph, ids, positions, logits)
        return self._captured[(batch, window)]


def _columns(states: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """``states [N, H, T, D]`` at columns ``source [N, W]`` of each row: ``[N, H, W, D]``."""
    index = source[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[-1])
    return states.gather(2, index)
