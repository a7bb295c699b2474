"""What the search environment works on: passages, questions, and loaders for user data.

User data follows the formats of Search-R1 and FlashRAG, so their files work unchanged:

* **Questions**: JSONL (one object per line) or Parquet (needs ``pyarrow``) with a
  ``question`` string and ``golden_answers`` (a list of strings, or one string); an ``id``
  is kept when present. Search-R1's Parquet files hold ``golden_answers`` under
  ``reward_model.ground_truth.target`` instead; that layout is read too.
* **Corpus**: JSONL with ``id`` and ``contents``. As in FlashRAG's wiki dumps, when
  ``contents`` has several lines and no ``title`` field is given, the first line is the
  title (surrounding quotes dropped) and the rest is the text.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Passage:
    """One retrievable document: ``doc_id`` is what ``open[doc_id]`` takes."""

    doc_id: str
    title: str
    text: str


@dataclass(frozen=True)
class Question:
    """One question with its accepted answers.

    ``hop_queries`` and ``hop_docs`` are the gold chain of a generated question: the query
    to issue at each hop and the passage that answers it. User questions have none.
    """

    question: str
    answers: tuple[str, ...]
    hop_queries: tuple[str, ...] = ()
    hop_docs: tuple[str, ...] = ()
    meta: dict[str, Any] = field(default_factory=dict, compare=False)


def read_records(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file, or of a Parquet file (``.parquet``; needs ``pyarrow``)."""
    path = Path(path)
    if path.suffix == ".parquet":
        yield from _parquet_rows(path)
        return
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object")
            yield row


def _parquet_rows(path: Path) -> Iterator[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: reading Parquet needs pyarrow (pip install pyarrow)") from None
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        yield from batch.to_pylist()


def read_questions(path: str | os.PathLike[str]) -> list[Question]:
    """Questions of a Search-R1 / FlashRAG question file (see the module docstring)."""
    questions = []
    for number, row in enumerate(read_records(path), 1):
        text, answers = row.get("question"), _golden_answers(row)
        if not isinstance(text, str) or not text.strip() or not answers:
            raise ValueError(f"{path}: row {number} needs a 'question' and non-empty 'golden_answers'")
        meta = {"id": str(row["id"])} if "id" in row else {}
        questions.append(Question(text.strip(), answers, meta=meta))
    if not questions:
        raise ValueError(f"{path}: no questions")
    return questions


def _golden_answers(row: dict[str, Any]) -> tuple[str, ...]:
    answers = row.get("golden_answers")
    if answers is None:  # Search-R1's processed Parquet layout
        answers = ((row.get("reward_model") or {}).get("ground_truth") or {}).get("target")
    if isinstance(answers, str):
        answers = [answers]
    return tuple(str(a) for a in answers or () if str(a).strip())


def read_corpus(path: str | os.PathLike[str]) -> Iterator[Passage]:
    """Passages of a corpus JSONL file (``id``, ``contents``, optional ``title``), streamed."""
    for number, row in enumerate(read_records(path), 1):
        if "id" not in row or not isinstance(row.get("contents"), str):
            raise ValueError(f"{path}: row {number} needs 'id' and a 'contents' string")
        yield _passage(str(row["id"]), row["contents"], row.get("title"))


def _passage(doc_id: str, contents: str, title: object) -> Passage:
    if isinstance(title, str):
        return Passage(doc_id, title, contents)
    first, newline, rest = contents.partition("\n")
    if newline and rest.strip():
        return Passage(doc_id, first.strip().strip('"'), rest.strip())
    return Passage(doc_id, "", contents.strip())
