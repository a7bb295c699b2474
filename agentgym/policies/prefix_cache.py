"""Key/value caches of prompts already seen, reused by the next prompt that starts with them.

A multi-turn episode sends the model the whole conversation every turn, and a group of
episodes on one task starts from the same prompt: without reuse every turn re-encodes the
system prompt, the goal and every earlier turn (on CPU that prefill is most of a rollout's
time). :class:`PrefixCache` keeps the per-layer keys and values of recent sequences (a
prompt just encoded, or a prompt plus the reply generated after it) so a new prompt only
encodes the tokens after its longest cached prefix.

Entries remember the weights version that computed them and are dropped when the weights
change, so a reused prefix is exactly what a fresh prefill would compute (up to float
rounding), and every recorded log-prob stays exact for its version.

Memory is bounded in bytes as well as entries: an entry costs ~46 kB a token for
SmolLM2-135M in fp32, so 128 entries of a textworld evaluation's 1-2k-token conversations
held ~12 GB (an ``agentgym eval`` at concurrency 32 reached 13.6 GB resident). An entry that
is a prefix of a newer one (the same episode's earlier turn, a group's shared first prompt)
is dropped when the newer one arrives: any prompt matches the newer one at least as far.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import psutil
import torch

MIN_REUSE_TOKENS = 16
"""Shorter common prefixes are not worth a separate forward."""


@dataclass(eq=False)
class CachedPrefix:
    """Keys and values of ``ids``: one ``(keys, values)`` pair per layer, each ``[1, H, len(ids), D]``."""

    ids: torch.Tensor
    layers: list[tuple[torch.Tensor, torch.Tensor]]

    def common_length(self, ids: torch.Tensor) -> int:
        """Length of the common prefix of this entry and ``ids``."""
        n = min(len(self.ids), len(ids))
        differs = (self.ids[:n] != ids[:n]).nonzero()
        return int(differs[0]) if len(differs) else n

    @property
    def nbytes(self) -> int:
        return sum(keys.nbytes + values.nbytes for keys, values in self.layers)

    def is_prefix_of(self, ids: torch.Tensor) -> bool:
        return len(self.ids) <= len(ids) and bool(torch.equal(self.ids, ids[: len(self.ids)]))

    def head(self, length: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Keys and values of the first ``length`` tokens."""
        return [(k[:, :, :length], v[:, :, :length]) for k, v in self.layers]


class PrefixCache:
    """The most recently used prefixes, at most ``capacity`` of them and ``max_bytes`` of
    keys and values in all, valid for one weights version.

    Args:
        capacity: entries kept; 0 turns reuse off.
        max_bytes: keys and values kept at most, in bytes; the least recently used
            entries go first. Each entry costs ``2 × layers × kv_heads × head_dim × tokens``
            numbers (about 46 kB per token for SmolLM2-135M in fp32).
    """

    def __init__(self, capacity: int, max_bytes: int) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.version: int | None = None
        self.nbytes = 0
        """Bytes of keys and values held now."""
        self._entries: OrderedDict[int, CachedPrefix] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def longest(self, prompt_ids: list[int], version: int) -> tuple[int, CachedPrefix | None]:
        """The longest cached prefix of ``prompt_ids`` under weights ``version``, leaving at
        least one token to encode (its logits start the reply): ``(length, entry)``, or
        ``(0, None)`` when nothing of at least :data:`MIN_REUSE_TOKENS` tokens matches."""
        self._expire(version)
        ids = torch.tensor(prompt_ids)
        best, found = 0, None
        for key, entry in self._entries.items():
            length = min(entry.common_length(ids), len(prompt_ids) - 1)
            if length > best:
                best, found = length, key
        if found is None or best < MIN_REUSE_TOKENS:
            return 0, None
        self._entries.move_to_end(found)
        return best, self._entries[found]

    def put(self, ids: list[int], layers: list[tuple[torch.Tensor, torch.Tensor]], version: int) -> None:
        """Remember the keys and values of ``ids`` computed by weights ``version``."""
        if self.capacity < 1 or len(ids) < MIN_REUSE_TOKENS:
            return
        self._expire(version)
        entry = CachedPrefix(torch.tensor(ids), layers)
        if entry.nbytes > self.max_bytes:
            return
        for key in [key for key, old in self._entries.items() if old.is_prefix_of(entry.ids)]:
            self._drop(key)
        self._entries[hash(tuple(ids))] = entry
        self.nbytes += entry.nbytes
        while len(self._entries) > self.capacity or self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: int) -> None:
        self.nbytes -= self._entries.pop(key).nbytes

    def _expire(self, version: int) -> None:
        if version != self.version:
            self._entries.clear()
            self.nbytes = 0
            self.version = version


def free_memory(device: torch.device) -> int:
    """Bytes free now on ``device``: the GPU's free memory, or the host's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available
