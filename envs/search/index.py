"""BM25 retrieval with tantivy: an index built once per corpus and cached on disk.

An index lives in ``<cache_dir>/bm25-v1-<key>/``, where ``key`` fingerprints the corpus
(the generator settings, or a user file's path, size and modification time). It is
built in a temporary folder and renamed into place, so processes sharing a cache never
see half an index and a duplicate build is simply dropped. Within a process one opened
index per folder is shared by every environment instance (searching is thread-safe).

Titles and texts are analysed with tantivy's English stemmer, and a title match counts
double, so a query naming an entity ranks that entity's own passage first.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import tantivy

from agentgym.envs.search.data import Passage

LAYOUT = "bm25-v1"
TITLE_BOOST = 2.0
MAX_QUERY_TERMS = 32
WRITER_HEAP_BYTES = 128 * 2**20
_WORDS = re.compile(r"\w+")


@dataclass(frozen=True)
class Hit:
    passage: Passage
    score: float


def query_terms(query: str) -> list[str]:
    """The words of a free-text query, lower-cased: tantivy's query language treats
    quotes, colons, brackets and upper-case AND/OR as syntax, and agents write anything."""
    return _WORDS.findall(query.lower())[:MAX_QUERY_TERMS]


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_text_field("doc_id", stored=True, tokenizer_name="raw")
    builder.add_text_field("title", stored=True, tokenizer_name="en_stem")
    builder.add_text_field("text", stored=True, tokenizer_name="en_stem")
    return builder.build()


class Bm25Index:
    """A built index folder, opened for search. Use :func:`open_index` to get one."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._schema = _schema()
        self._index = tantivy.Index(self._schema, path=str(path))
        self._searcher = self._index.searcher()

    def __len__(self) -> int:
        return self._searcher.num_docs

    def search(self, query: str, k: int) -> list[Hit]:
        """The ``k`` best passages for ``query`` by BM25, best first (none for a query
        without words)."""
        terms = query_terms(query)
        if not terms:
            return []
        parsed = self._index.parse_query(
            " ".join(terms), ["title", "text"], field_boosts={"title": TITLE_BOOST}
        )
        result = self._searcher.search(parsed, k)
        return [Hit(self._passage(address), score) for score, address in result.hits]

    def get(self, doc_id: str) -> Passage | None:
        """The passage with id ``doc_id``, or ``None``."""
        query = tantivy.Query.term_query(self._schema, "doc_id", doc_id)
        hits = self._searcher.search(query, 1).hits
        return self._passage(hits[0][1]) if hits else None

    def _passage(self, address: tantivy.DocAddress) -> Passage:
        doc = self._searcher.doc(address)
        return Passage(doc["doc_id"][0], doc["title"][0], doc["text"][0])


def build_index(path: Path, passages: Iterable[Passage]) -> int:
    """Write ``passages`` into a new index at ``path`` (which must not exist); returns
    the number of passages. Duplicate doc ids are an error: ``open[doc_id]`` needs one."""
    path.mkdir(parents=True)
    index = tantivy.Index(_schema(), path=str(path))
    writer = index.writer(heap_size=WRITER_HEAP_BYTES, num_threads=1)
    seen: set[str] = set()
    for passage in passages:
        if passage.doc_id in seen:
            raise ValueError(f"duplicate passage id {passage.doc_id!r} in the corpus")
        seen.add(passage.doc_id)
        writer.add_document(tantivy.Document(doc_id=passage.doc_id, title=passage.title, text=passage.text))
    writer.commit()
    writer.wait_merging_threads()
    return len(seen)


_opened: dict[Path, Bm25Index] = {}
_lock = threading.Lock()


def open_index(cache_dir: Path, key: str, passages: Callable[[], Iterable[Passage]]) -> Bm25Index:
    """The cached index of corpus ``key``, built from ``passages()`` on first use.

    One build at a time per process (the lock), and an atomic rename across processes.
    """
    path = (cache_dir / f"{LAYOUT}-{key}").resolve()
    with _lock:
        if path not in _opened:
            if not path.is_dir():
                _build_atomically(path, passages)
            _opened[path] = Bm25Index(path)
        return _opened[path]


def _build_atomically(path: Path, passages: Callable[[], Iterable[Passage]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=path.parent))
    try:
        build_index(tmp / "index", passages())
        with contextlib.suppress(OSError):  # another process won the race: keep theirs
            os.rename(tmp / "index", path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
