"""Continuous batching of generation requests over a Hugging Face causal LM.

Requests from many episodes go into one queue. A worker thread (torch releases the GIL,
so the event loop stays free) runs a *live batch*: each iteration it admits waiting
requests (one prefill forward for the newcomers, whose keys and values are then copied
into free slots of the live batch's :class:`~agentgym.policies.slots.SlotCache`), samples
one token for every row, answers the rows that finished at once, drops them from the
batch, and runs one decode forward for the rest. So no episode waits for a whole batch to
drain, and no turn-level barrier exists between episodes.

Each row's positions are its own (``position_ids``; prefills are left-padded and the
padding masked), so a row's tokens do not depend on what else shares its batch (up to
float rounding). Decode steps run on static slots whose shapes change only between a few
buckets, captured as CUDA graphs on a GPU (:mod:`agentgym.policies.slots`).

Every sampled token records the weights version (:attr:`ContinuousBatcher.version`) of
the forward that computed its logits, so a trainer that updates the weights between two
steps knows exactly which weights sampled each token (``Generation.versions``).

Prompts that start with a sequence encoded earlier under the same weights (the previous
turn of the same episode, or the same first prompt of a group of episodes) reuse its keys
and values (:mod:`agentgym.policies.prefix_cache`), so a turn encodes only its new tokens.

Caches that are not plain full-attention ``DynamicCache`` layers (sliding windows,
recurrent state) cannot be slotted; then the live batch decodes on the model's own cache,
newcomers wait until it drains, and nothing is reused.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from agentgym.policies.base import Generation, SamplingParams
from agentgym.policies.live_batch import (
    LiveBatch,
    PaddedBatch,
    Row,
    SlottedBatch,
    allowed_tokens,
    fail,
    left_padded,
    pad_left,
    select,
    slottable,
    stamp,
    started,
)
from agentgym.policies.prefix_cache import CachedPrefix, PrefixCache, free_memory
from agentgym.policies.sampling import draw_keys, sample_next
from agentgym.policies.slots import SlotCache

log = logging.getLogger(__name__)

# transformers 5.24 renamed the forward's KV cache, argument and output alike, from
# ``past_key_values`` to ``cache``: the old name warns on every run and goes in 5.40.
# Earlier releases know only the old one.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def last_position_only(input_ids: torch.Tensor) -> torch.Tensor:
    """``logits_to_keep`` for the last position alone, as an index rather than ``1``.

    With ``1`` the model slices its hidden states (``[:, -1:]``) and hands the output layer a
    strided view; torch 2.13's bfloat16 matmul on CPU takes that view about 150 times slower
    than a contiguous copy (16 rows of 300 tokens: 0.95 s against 6 ms for SmolLM2's head).
    An index tensor makes transformers gather the rows, a contiguous copy; the logits are
    the same."""
    return torch.tensor([input_ids.shape[1] - 1], device=input_ids.device)


@dataclass
class BatcherStats:
    """Counters for logs, benchmarks and tests."""

    prefills: int = 0
    """Prefill forwards: each admits newly queued requests."""
    prompt_tokens: int = 0
    """Prompt tokens encoded by prefills."""
    reused_tokens: int = 0
    """Prompt tokens whose keys and values came from the prefix cache instead."""
    decode_steps: int = 0
    """Decode forwards (one token for every live row)."""
    requests: int = 0
    """Requests answered."""
    tokens: int = 0
    """Tokens sampled."""
    max_rows: int = 0
    """Largest live batch seen."""
    abandoned: int = 0
    """Rows dropped mid-reply because their caller gave up (:meth:`ContinuousBatcher.abandon`)."""


class ContinuousBatcher:
    """Serve :meth:`submit` calls from any thread with one model in one worker thread.

    Args:
        model: a causal LM in eval mode.
        tokenizer: decodes replies and stop-string checks.
        stop_ids: token ids that end a reply (kept in ``token_ids``).
        max_batch_size: live rows at most.
        batch_wait_s: how long an idle worker waits after the first request for more
            to arrive before its first prefill.
        max_positions: context length of the model; a reply that reaches it ends with
            ``finish_reason="length"``.
        prefix_cache: encoded sequences kept for reuse by later prompts that start with
            them; default ``4 × max_batch_size`` (every live episode's last turn and
            more); 0 turns reuse off.
        prefix_cache_bytes: their keys and values at most, in bytes; default a quarter of
            the memory free on the model's device when the batcher is made.
        cuda_graphs: replay decode steps as CUDA graphs on a CUDA device (default: yes);
            a capture that fails falls back to eager steps.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        stop_ids: set[int],
        max_batch_size: int = 8,
        batch_wait_s: float = 0.005,
        max_positions: int | None = None,
        prefix_cache: int | None = None,
        prefix_cache_bytes: int | None = None,
        cuda_graphs: bool = True,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_ids
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_positions = max_positions
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stop_ids)
        self.stats = BatcherStats()
        self.prefixes = PrefixCache(
            4 * max_batch_size if prefix_cache is None else prefix_cache,
            max_bytes=free_memory(self.device) // 4 if prefix_cache_bytes is None else prefix_cache_bytes,
        )
        self.cuda_graphs = cuda_graphs
        self.slots: SlotCache | None = None
        """The live rows' keys and values, made at the first prefill of a slottable model."""
        self.lock = threading.Lock()
        """Held around every forward pass; hold it to change the weights between steps."""
        self.version = 0
        """Weights version recorded on every sampled token; whoever changes the weights sets
        it while holding :attr:`lock`, so a sampling step never sees a half-done update."""
        self._queue: queue.SimpleQueue[Row | None] = queue.SimpleQueue()
        self._abandoned: set[Future] = set()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._state_lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def submit(
        self, prompt_ids: list[int], sampling: SamplingParams, choices: Sequence[Sequence[int]] | None = None
    ) -> Future:
        """Queue one request; the future resolves to its :class:`Generation`. ``choices``:
        the reply must be one of these token sequences, each ending with a stop id
        (constrained decoding); None or empty: any reply."""
        if not prompt_ids:
            raise ValueError("prompt_ids is empty")
        if sampling.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1")
        if choices and any(not choice or choice[-1] not in self.stop_ids for choice in choices):
            raise ValueError("every choice must be a non-empty token sequence ending with a stop id")
        row = Row(list(prompt_ids), sampling, Future())
        row.choices = [list(choice) for choice in choices] if choices else None
        # Under the lock, so a request never slips in after close() drained the queue.
        with self._state_lock:
            if self._closed:
                raise RuntimeError("the policy is closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agentgym-hf-batcher", daemon=True)
                self._thread.start()
            self._queue.put(row)
        return row.future

    def abandon(self, future: Future) -> None:
        """The caller of ``future`` no longer wants its reply: a queued request is dropped,
        a generating one leaves the batch at the next step (its tokens stop costing)."""
        if not future.cancel():
            self._abandoned.add(future)

    def close(self) -> None:
        """Stop the worker; requests not yet answered fail with RuntimeError. Idempotent."""
        with self._state_lock:
            self._closed = True
            self._queue.put(None)  # wakes an idle worker
        if self._thread is not None:
            self._thread.join()

    # ----- the worker ------------------------------------------------------------------

    def _run(self) -> None:
        live: LiveBatch | None = None
        while not self._closed:
            newcomers = self._take(live)
            with self.lock, torch.inference_mode():
                if newcomers:
                    live = self._admit(live, newcomers)
                if live is not None:
                    live = self._guarded(live.rows, self._step, live)
        self._fail_all(live)

    def _admit(self, live: LiveBatch | None, rows: list[Row]) -> LiveBatch | None:
        """Prefill ``rows`` and add them to ``live``; a failed prefill (a prompt too
        long for memory, say) fails only its newcomers. Rows with a cached prefix share
        one forward that encodes only the rest of their prompts; the others share another."""
        fresh, extended, prefixes = [], [], []
        for row in rows:
            length, prefix = self.prefixes.longest(row.prompt_ids, self.version)
            if prefix is None:
                fresh.append(row)
            else:
                extended.append(row)
                prefixes.append((prefix, length))
        batches = []
        if extended:
            batches.append(self._guarded(extended, self._extend, extended, prefixes))
        if fresh:
            batches.append(self._guarded(fresh, self._prefill, fresh))
        for batch in batches:
            if batch is None:
                continue
            if live is None and not slottable(batch.cache):
                live = batch  # decodes on the model's own cache until it drains
            else:
                rows = batch.rows if live is None else live.rows + batch.rows
                live = self._guarded(rows, self._slot_in, live, batch)
        return live

    def _slot_in(self, live: SlottedBatch | None, batch: PaddedBatch) -> SlottedBatch:
        """``batch`` (a prefill's rows) copied into free slots after ``live``'s rows."""
        layers = [(layer.keys, layer.values) for layer in batch.cache.layers]
        if self.slots is None:
            graphs = self.cuda_graphs and self.device.type == "cuda"
            self.slots = SlotCache(layers, self.max_batch_size, self.max_positions, graphs)
        if live is None:
            self.slots.rows = 0  # the last live batch drained, or failed: every slot is free
        self.slots.admit(layers, batch.mask)
        if live is None:
            return SlottedBatch(batch.rows, batch.logits, self.slots)
        return SlottedBatch(live.rows + batch.rows, torch.cat([live.logits, batch.logits]), self.slots)

    def _guarded(self, rows: list[Row], fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; on an error, fail ``rows`` (whose requests it served) and return
        None, so the worker lives on."""
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("generation failed")
            for row in rows:
                fail(row, exc)
            return None

    def _take(self, live: LiveBatch | None) -> list[Row]:
        """Newly queued rows that fit: an idle worker blocks for the first one and waits
        ``batch_wait_s`` for company; a busy one takes only what is already waiting."""
        if live is None:
            return started(self._take_idle())
        rows: list[Row] = []
        while len(rows) < live.room(self.max_batch_size):
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                break
            if row is not None:
                rows.append(row)
        return started(rows)

    def _take_idle(self) -> list[Row]:
        first = self._queue.get()
        if first is None:  # close() woke us
            return []
        rows = [first]
        deadline = time.monotonic() + self.batch_wait_s
        while len(rows) < self.max_batch_size:
            try:
                row = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                break
            if row is None:
                break
            rows.append(row)
        return rows

    def _prefill(self, rows: list[Row]) -> PaddedBatch:
        """Encode each distinct prompt once (a group's episodes start alike) and give
        every row its copy; the prompts are cached for reuse."""
        prompts = list(dict.fromkeys(tuple(row.prompt_ids) for row in rows))
        ids, mask = left_padded(prompts, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache, logits = self._forward(ids, mask, positions)
        self.stats.prefills += 1
        self.stats.prompt_tokens += int(mask.sum())
        distinct = PaddedBatch([], logits, cache, mask)
        for i, prompt in enumerate(prompts):
            self._remember(list(prompt), distinct, i)
        slot = {prompt: i for i, prompt in enumerate(prompts)}
        live = select(distinct, [slot[tuple(row.prompt_ids)] for row in rows], rows)
        stamp(rows, self.version)
        return live

    def _extend(self, rows: list[Row], prefixes: list[tuple[CachedPrefix, int]]) -> PaddedBatch:
        """Encode the tokens of each row's prompt after its cached prefix ``(entry, length)``.

        The cache is the prefixes left-padded to one width, the input the rest of each
        prompt left-padded to another, so a row's cache reads ``[pad | prefix | pad | rest]``:
        the mask hides both pads and positions are given per row."""
        heads = [prefix.head(length) for prefix, length in prefixes]
        width = max(length for _, length in prefixes)
        cache = DynamicCache()
        for layer in range(len(heads[0])):
            keys = torch.cat([pad_left(head[layer][0], width, 2) for head in heads])
            values = torch.cat([pad_left(head[layer][1], width, 2) for head in heads])
            cache.update(keys, values, layer)
        lengths = torch.tensor([length for _, length in prefixes])[:, None]
        rests = [row.prompt_ids[length:] for row, (_, length) in zip(rows, prefixes, strict=True)]
        ids, rest_mask = left_padded(rests, self.pad_id)
        prefix_mask = (torch.arange(width) >= width - lengths).long()
        positions = (rest_mask.cumsum(-1) - 1).clamp(min=0) + lengths
        mask = torch.cat([prefix_mask, rest_mask], dim=1)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        cache, logits = self._forward(ids, mask, positions, cache)
        self.stats.prefills += 1
        self.stats.prompt_tokens += sum(len(rest) for rest in rests)
        self.stats.reused_tokens += sum(length for _, length in prefixes)
        stamp(rows, self.version)
        return PaddedBatch(rows, logits, cache, mask)

    def _remember(self, ids: list[int], live: LiveBatch, index: int) -> None:
        """Cache the keys and values of ``live``'s row ``index``, which encode ``ids``."""
        if self.prefixes.capacity < 1:
            return
        layers = live.row_cache(index, len(ids))
        if layers is not None:
            self.prefixes.put(ids, layers, self.version)

    def _step(self, live: LiveBatch) -> LiveBatch | None:
        """Sample a token for every row, answer the finished rows, decode the rest."""
        if self._abandoned and any(row.future in self._abandoned for row in live.rows):
            live = self._without_abandoned(live)
            if live is None:
                return None
        rows = live.rows
        self.stats.max_rows = max(self.stats.max_rows, len(rows))
        temperature = torch.tensor([row.sampling.temperature for row in rows], device=self.device)
        top_p = torch.tensor([row.sampling.top_p for row in rows], device=self.device)
        keys = draw_keys(
            [row.sampling.seed for row in rows], [len(row.token_ids) for row in rows], self.device
        )
        tokens, logprobs = sample_next(
            live.logits, temperature, top_p, keys, allowed_tokens(rows, live.logits)
        )
        keep = []
        for i, (row, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.token_ids.append(token)
            row.logprobs.append(logprob)
            row.versions.append(row.logits_version)
            reason = self._finish_reason(row)
            if reason is None:
                keep.append(i)
                continue
            if row.kv_version == self.version:
                # The cache holds every token but the one just sampled (never fed back).
                self._remember(row.prompt_ids + row.token_ids[:-1], live, i)
            self._answer(row, reason)
        self.stats.tokens += len(rows)
        if not keep:
            return None
        if len(keep) < len(rows):
            live = live.keep(keep)
        return self._decode(live, tokens[keep])

    def _without_abandoned(self, live: LiveBatch) -> LiveBatch | None:
        keep = [i for i, row in enumerate(live.rows) if row.future not in self._abandoned]
        for row in live.rows:
            if row.future in self._abandoned:
                self._abandoned.discard(row.future)
                self.stats.abandoned += 1
                fail(row, CancelledError("the caller gave up on this request"))
        return live.keep(keep) if keep else None

    def _decode(self, live: LiveBatch, tokens: torch.Tensor) -> LiveBatch:
        live = live.decode(self._forward, tokens)
        self.stats.decode_steps += 1
        stamp(live.rows, self.version)
        return live

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any = None
    ) -> tuple[Any, torch.Tensor]:
        """One forward pass on top of ``cache`` (None: from scratch): the extended KV cache
        and each row's next-token logits. The cache goes in and comes out under the
        installed transformers' name for it (``CACHE``)."""
        past = {} if cache is None else {CACHE: cache}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=last_position_only(ids),
            **past,
        )
        return out[CACHE], out.logits[:, -1, :]

    def _finish_reason(self, row: Row) -> str | None:
        if row.token_ids[-1] in self.stop_ids:
            return "stop"
        if row.sampling.stop and self._cut_at_stop_string(row):
            return "stop"
        if len(row.token_ids) >= row.sampling.max_new_tokens:
            return "length"
        if self.max_positions is not None and row.last_position + 1 >= self.max_positions:
            return "length"
        return None

    def _cut_at_stop_string(self, row: Row) -> bool:
        """Whether the reply now contains a stop string; if so keep the text before it.
        (The token that completed the stop string stays in ``token_ids``: tokens are
        never split, and the rollout continues from the exact ids.)"""
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        hits = [i for i in (text.find(stop) for stop in row.sampling.stop if stop) if i >= 0]
        if hits:
            row.text = text[: min(hits)]
        return bool(hits)

    def _answer(self, row: Row, reason: str) -> None:
        text = row.text
        if text is None:
            text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        self.stats.requests += 1
        row.future.set_result(Generation(text, row.token_ids, row.logprobs, reason, versions=row.versions))

    def _fail_all(self, live: LiveBatch | None) -> None:
        closed = RuntimeError("the policy was closed before this request was answered")
        for row in live.rows if live else []:
            fail(row, closed)
        while True:
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                return
            if row is not None and row.future.set_running_or_notify_cancel():
                fail(row, closed)
