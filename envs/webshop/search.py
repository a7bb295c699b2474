"""Product search: a tantivy (BM25) inverted index over titles and product text.

The index is built once per catalog and kept on disk under a folder named by the
catalog's fingerprint; later processes open it in milliseconds. It is built in a
temporary folder and renamed into place, so a crashed or concurrent build never leaves
a half-written index behind.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import tantivy

from agentgym.envs.webshop.catalog import Product

INDEX_LAYOUT = "v1"
"""Bump when the schema or the indexed text changes, so stale indexes are rebuilt."""
TITLE_BOOST = 2.0
"""Title words weigh double: a product named for the query beats one that mentions it."""
WRITER_HEAP = 64 * 1024 * 1024

_TOKEN = re.compile(r"[a-z0-9]+")


def _schema() -> tantivy.Schema:
    builder = tantivy.SchemaBuilder()
    builder.add_unsigned_field("row", stored=True)
    builder.add_text_field("title", stored=False)
    builder.add_text_field("body", stored=False)
    return builder.build()


class SearchIndex:
    """BM25 search over one catalog. ``search`` is safe to call from many threads."""

    def __init__(self, products: Sequence[Product], folder: Path) -> None:
        self.products = products
        self.folder = folder
        if not (folder / "meta.json").exists():
            _build(products, folder)
        self._index = tantivy.Index(_schema(), path=str(folder), reuse=True)
        self._searcher = self._index.searcher()

    def search(self, query: str, limit: int = 50) -> list[Product]:
        """The best ``limit`` products for ``query`` (any words; punctuation is ignored)."""
        terms = _TOKEN.findall(query.lower())
        if not terms:
            return []
        parsed = self._index.parse_query(
            " ".join(terms), ["title", "body"], field_boosts={"title": TITLE_BOOST}
        )
        hits = self._searcher.search(parsed, limit).hits
        return [self.products[self._searcher.doc(address)["row"][0]] for _, address in hits]


def _build(products: Sequence[Product], folder: Path) -> None:
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    try:
        index = tantivy.Index(_schema(), path=str(staging))
        writer = index.writer(heap_size=WRITER_HEAP, num_threads=1)
        for row, product in enumerate(products):
            writer.add_document(tantivy.Document(row=row, title=product.title, body=product.search_text()))
        writer.commit()
        writer.wait_merging_threads()
        try:
            os.rename(staging, folder)
        except OSError:  # another process finished the same build first: use its index
            if not (folder / "meta.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
