"""Continuous batching of generation requests over a Hugging Face causal LM.

Requests from many episodes go into one queue. A worker thread (torch releases the GIL,
so the event loop stays free) runs a *live batch*: each iteration it admits waiting
requests (one prefill forward for the newcomers, whose KV cache is then merged into the
live one), samples one token for every row, answers the rows that finished at once,
drops them from the batch, and runs one decode forward for the rest. So no episode
waits for a whole batch to drain, and no turn-level barrier exists between episodes.

Rows are left-padded: every row's cache has the same length, real positions are given
explicitly (``position_ids``) and padding is masked, so a row's tokens do not depend on
what else shares its batch (up to float rounding).

Every sampled token records the weights version (:attr:`ContinuousBatcher.version`) of
the forward that computed its logits, so a trainer that updates the weights between two
steps knows exactly which weights sampled each token (``Generation.versions``).

Prompts that start with a sequence encoded earlier under the same weights (the previous
turn of the same episode, or the same first prompt of a group of episodes) reuse its keys
and values (:mod:`agentgym.policies.prefix_cache`), so a turn encodes only its new tokens.

Caches that are not plain full-attention ``DynamicCache`` layers (sliding windows,
recurrent state) cannot be merged; then newcomers wait until the live batch drains, and
nothing is reused.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from agentgym.policies.base import Generation, SamplingParams
from agentgym.policies.prefix_cache import CachedPrefix, PrefixCache
from agentgym.policies.sampling import sample_next

log = logging.getLogger(__name__)

# transformers 5.24 renamed the forward's KV cache, argument and output alike, from
# ``past_key_values`` to ``cache``: the old name warns on every run and goes in 5.40.
# Earlier releases know only the old one.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


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


@dataclass(eq=False)
class _Row:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: Future
    generator: torch.Generator | None
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
    """Constrained rows: the token sequences the reply may still become (each ends with a
    stop id); None: any reply."""

    def allowed_next(self) -> list[int] | None:
        """Constrained rows: the tokens that keep the reply on one of its choices."""
        if self.choices is None:
            return None
        return sorted({choice[len(self.token_ids)] for choice in self.choices})

    def keep_choices_after(self, token: int) -> None:
        if self.choices is not None:
            position = len(self.token_ids) - 1
            self.choices = [c for c in self.choices if c[position] == token]

    @property
    def last_position(self) -> int:
        """Position id of the newest token (the next decode input)."""
        return len(self.prompt_ids) + len(self.token_ids) - 1


@dataclass
class _LiveBatch:
    rows: list[_Row]
    cache: Any
    """The model's KV cache; every row has the same (left-padded) length."""
    mask: torch.Tensor
    """``[B, T]`` attention mask over the cache: 0 on padding."""
    logits: torch.Tensor
    """``[B, V]`` next-token logits of every row."""


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
        self.prefixes = PrefixCache(4 * max_batch_size if prefix_cache is None else prefix_cache)
        self.lock = threading.Lock()
        """Held around every forward pass; hold it to change the weights between steps."""
        self.version = 0
        """Weights version recorded on every sampled token; whoever changes the weights sets
        it while holding :attr:`lock`, so a sampling step never sees a half-done update."""
        self._queue: queue.SimpleQueue[_Row | None] = queue.SimpleQueue()
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
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(sampling.seed)
        row = _Row(list(prompt_ids), sampling, Future(), generator)
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

    def close(self) -> None:
        """Stop the worker; requests not yet answered fail with RuntimeError. Idempotent."""
        with self._state_lock:
            self._closed = True
            self._queue.put(None)  # wakes an idle worker
        if self._thread is not None:
            self._thread.join()

    # ----- the worker ------------------------------------------------------------------

    def _run(self) -> None:
        live: _LiveBatch | None = None
        while not self._closed:
            newcomers = self._take(live)
            with self.lock, torch.inference_mode():
                if newcomers:
                    live = self._admit(live, newcomers)
                if live is not None:
                    live = self._guarded(live.rows, self._step, live)
        self._fail_all(live)

    def _admit(self, live: _LiveBatch | None, rows: list[_Row]) -> _LiveBatch | None:
        """Prefill ``rows`` and merge them into ``live``; a failed prefill (a prompt too
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
            if batch is not None:
                live = batch if live is None else self._guarded(live.rows + batch.rows, _merge, live, batch)
        return live

    def _guarded(self, rows: list[_Row], fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)``; on an error, fail ``rows`` (whose requests it served) and return
        None, so the worker lives on."""
        try:
            return fn(*args)
        except Exception as exc:
            log.exception("generation failed")
            for row in rows:
                _fail(row, exc)
            return None

    def _take(self, live: _LiveBatch | None) -> list[_Row]:
        """Newly queued rows that fit: an idle worker blocks for the first one and waits
        ``batch_wait_s`` for company; a busy one takes only what is already waiting."""
        if live is None:
            return _started(self._take_idle())
        room = self.max_batch_size - len(live.rows) if _mergeable(live.cache) else 0
        rows: list[_Row] = []
        while len(rows) < room:
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                break
            if row is not None:
                rows.append(row)
        return _started(rows)

    def _take_idle(self) -> list[_Row]:
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

    def _prefill(self, rows: list[_Row]) -> _LiveBatch:
        """Encode each distinct prompt once (a group's episodes start alike) and give
        every row its copy; the prompts are cached for reuse."""
        prompts = list(dict.fromkeys(tuple(row.prompt_ids) for row in rows))
        ids, mask = _left_padded(prompts, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache, logits = self._forward(ids, mask, positions)
        self.stats.prefills += 1
        self.stats.prompt_tokens += int(mask.sum())
        distinct = _LiveBatch([], cache, mask, logits)
        for i, prompt in enumerate(prompts):
            self._remember(list(prompt), distinct, i)
        slot = {prompt: i for i, prompt in enumerate(prompts)}
        live = _select(distinct, [slot[tuple(row.prompt_ids)] for row in rows], rows)
        _stamp(rows, self.version)
        return live

    def _extend(self, rows: list[_Row], prefixes: list[tuple[CachedPrefix, int]]) -> _LiveBatch:
        """Encode the tokens of each row's prompt after its cached prefix ``(entry, length)``.

        The cache is the prefixes left-padded to one width, the input the rest of each
        prompt left-padded to another, so a row's cache reads ``[pad | prefix | pad | rest]``:
        the mask hides both pads and positions are given per row."""
        heads = [prefix.head(length) for prefix, length in prefixes]
        width = max(length for _, length in prefixes)
        cache = DynamicCache()
        for layer in range(len(heads[0])):
            keys = torch.cat([_pad_left(head[layer][0], width, 2) for head in heads])
            values = torch.cat([_pad_left(head[layer][1], width, 2) for head in heads])
            cache.update(keys, values, layer)
        lengths = torch.tensor([length for _, length in prefixes])[:, None]
        rests = [row.prompt_ids[length:] for row, (_, length) in zip(rows, prefixes, strict=True)]
        ids, rest_mask = _left_padded(rests, self.pad_id)
        prefix_mask = (torch.arange(width) >= width - lengths).long()
        positions = (rest_mask.cumsum(-1) - 1).clamp(min=0) + lengths
        mask = torch.cat([prefix_mask, rest_mask], dim=1)
        ids, mask, positions = ids.to(self.device), mask.to(self.device), positions.to(self.device)
        cache, logits = self._forward(ids, mask, positions, cache)
        self.stats.prefills += 1
        self.stats.prompt_tokens += sum(len(rest) for rest in rests)
        self.stats.reused_tokens += sum(length for _, length in prefixes)
        _stamp(rows, self.version)
        return _LiveBatch(rows, cache, mask, logits)

    def _remember(self, ids: list[int], live: _LiveBatch, index: int) -> None:
        """Cache the keys and values of ``live``'s row ``index``, which encode ``ids``."""
        if self.prefixes.capacity < 1 or not _mergeable(live.cache):
            return
        columns = live.mask[index].nonzero().flatten()
        layers = [
            (layer.keys[index : index + 1, :, columns], layer.values[index : index + 1, :, columns])
            for layer in live.cache.layers
        ]
        self.prefixes.put(ids, layers, self.version)

    def _step(self, live: _LiveBatch) -> _LiveBatch | None:
        """Sample a token for every row, answer the finished rows, decode the rest."""
        rows = live.rows
        self.stats.max_rows = max(self.stats.max_rows, len(rows))
        temperature = torch.tensor([row.sampling.temperature for row in rows], device=self.device)
        top_p = torch.tensor([row.sampling.top_p for row in rows], device=self.device)
        generators = [row.generator for row in rows]
        tokens, logprobs = sample_next(
            live.logits, temperature, top_p, generators, _allowed(rows, live.logits)
        )
        keep = []
        for i, (row, token, logprob) in enumerate(zip(rows, tokens.tolist(), logprobs.tolist(), strict=True)):
            row.token_ids.append(token)
            row.keep_choices_after(token)
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
            live = _select(live, keep)
        return self._decode(live, tokens[keep])

    def _decode(self, live: _LiveBatch, tokens: torch.Tensor) -> _LiveBatch:
        mask = torch.cat([live.mask, live.mask.new_ones((len(live.rows), 1))], dim=1)
        positions = torch.tensor([[row.last_position] for row in live.rows], device=self.device)
        cache, logits = self._forward(tokens[:, None], mask, positions, live.cache)
        self.stats.decode_steps += 1
        _stamp(live.rows, self.version)
        return _LiveBatch(live.rows, cache, mask, logits)

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
            logits_to_keep=1,
            **past,
        )
        return out[CACHE], out.logits[:, -1, :]

    def _finish_reason(self, row: _Row) -> str | None:
        if row.token_ids[-1] in self.stop_ids:
            return "stop"
        if row.sampling.stop and self._cut_at_stop_string(row):
            return "stop"
        if len(row.token_ids) >= row.sampling.max_new_tokens:
            return "length"
        if self.max_positions is not None and row.last_position + 1 >= self.max_positions:
            return "length"
        return None

    def _cut_at_stop_string(self, row: _Row) -> bool:
        """Whether the reply now contains a stop string; if so keep the text before it.
        (The token that completed the stop string stays in ``token_ids``: tokens are
        never split, and the rollout continues from the exact ids.)"""
        text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        hits = [i for i in (text.find(stop) for stop in row.sampling.stop if stop) if i >= 0]
        if hits:
            row.text = text[: min(hits)]
        return bool(hits)

    def _answer(self, row: _Row, reason: str) -> None:
        text = row.text
        if text is None:
            text = self.tokenizer.decode(row.token_ids, skip_special_tokens=True)
        self.stats.requests += 1
        row.future.set_result(Generation(text, row.token_ids, row.logprobs, reason, versions=row.versions))

    def _fail_all(self, live: _LiveBatch | None) -> None:
        closed = RuntimeError("the policy was closed before this request was answered")
        for row in live.rows if live else []:
            _fail(row, closed)
        while True:
            try:
                row = self._queue.get_nowait()
            except queue.Empty:
                return
            if row is not None and row.future.set_running_or_notify_cancel():
                _fail(row, closed)


def _allowed(rows: list[_Row], logits: torch.Tensor) -> torch.Tensor | None:
    """``[B, V]`` the tokens each row may draw next; None when no row is constrained."""
    nexts = [row.allowed_next() for row in rows]
    if all(tokens is None for tokens in nexts):
        return None
    allowed = torch.ones(logits.shape, dtype=torch.bool, device=logits.device)
    for i, tokens in enumerate(nexts):
        if tokens is not None:
            allowed[i] = False
            allowed[i, tokens] = True
    return allowed


def _started(rows: list[_Row]) -> list[_Row]:
    """Drop requests whose caller gave up (cancelled) before they started."""
    return [row for row in rows if row.future.set_running_or_notify_cancel()]


def _stamp(rows: list[_Row], version: int) -> None:
    """Record which weights computed the rows' next-token logits (and wrote their cache).
    Called right after a forward, under :attr:`ContinuousBatcher.lock`, so ``version`` is
    exactly the weights that forward used, even when an update lands before the token is
    sampled."""
    for row in rows:
        row.logits_version = version
        row.kv_version = version if row.kv_version in (None, version) else -1


def _fail(row: _Row, exc: BaseException) -> None:
    if not row.future.done():
        row.future.set_exception(exc)


def _mergeable(cache: Any) -> bool:
    """Only plain full-attention dynamic layers can be left-padded and concatenated."""
    return isinstance(cache, DynamicCache) and all(type(layer) is DynamicLayer for layer in cache.layers)


def _merge(live: _LiveBatch, new: _LiveBatch) -> _LiveBatch:
    """Concatenate two batches, left-padding the shorter cache with masked zeros."""
    width = max(live.mask.shape[1], new.mask.shape[1])
    for old_layer, new_layer in zip(live.cache.layers, new.cache.layers, strict=True):
        old_layer.keys = torch.cat([_pad_left(old_layer.keys, width, 2), _pad_left(new_layer.keys, width, 2)])
        old_layer.values = torch.cat(
            [_pad_left(old_layer.values, width, 2), _pad_left(new_layer.values, width, 2)]
        )
    mask = torch.cat([_pad_left(live.mask, width, 1), _pad_left(new.mask, width, 1)])
    return _LiveBatch(live.rows + new.rows, live.cache, mask, torch.cat([live.logits, new.logits]))


def _select(live: _LiveBatch, keep: list[int], rows: list[_Row] | None = None) -> _LiveBatch:
    """Keep rows ``keep`` (an index may repeat: the row is copied), as ``rows`` if given;
    drop cache columns that are padding in every remaining row."""
    index = torch.tensor(keep, device=live.mask.device)
    live.cache.batch_select_indices(index)
    mask = live.mask[index]
    if _mergeable(live.cache):
        first = int(mask.any(dim=0).int().argmax())
        if first > 0:
            mask = mask[:, first:]
            for layer in live.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
    kept = [live.rows[i] for i in keep] if rows is None else rows
    return _LiveBatch(kept, live.cache, mask, live.logits[index])


def _left_padded(sequences: list[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``sequences`` as ``[B, width]`` ids aligned right (left-padded with ``pad_id``) and
    the matching attention mask (0 on padding)."""
    width = max(len(sequence) for sequence in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, sequence in enumerate(sequences):
        ids[i, width - len(sequence) :] = torch.tensor(sequence)
        mask[i, width - len(sequence) :] = 1
    return ids, mask


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
