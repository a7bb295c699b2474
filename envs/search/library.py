"""What a search server searches and asks: one corpus index plus the question splits,
built once per configuration and shared by every environment instance in the process
(servers build one instance per session; the corpus must not be rebuilt each time)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentgym.contract.core import Task
from agentgym.envs.search.data import Passage, Question, read_corpus, read_questions
from agentgym.envs.search.index import Bm25Index, open_index
from agentgym.envs.search.kb import GENERATOR_VERSION, KnowledgeBase
from agentgym.envs.search.retrieval import Retriever, make_retriever


@dataclass(frozen=True)
class GeneratedSource:
    """The built-in knowledge base (see :mod:`agentgym.envs.search.kb`)."""

    kb_seed: int = 0
    kb_scale: int = 1
    distractors: int = 2
    hops: tuple[int, ...] = (1, 2, 3, 4)
    n_train: int = 500
    n_test: int = 100
    n_validation: int = 100


@dataclass(frozen=True)
class UserSource:
    """A user's corpus JSONL and question files, one file per split."""

    corpus: str
    questions: tuple[tuple[str, str], ...]
    """``(split, path)`` pairs."""


@dataclass(frozen=True)
class Library:
    index: Bm25Index
    tasks: Mapping[str, Sequence[Task]]
    questions: Mapping[str, Question]
    """By task id."""
    cache_dir: Path
    key: str
    """The corpus fingerprint: names the cached index and embeddings."""
    passages: Callable[[], Iterable[Passage]]
    """The corpus again, for building the embeddings of dense retrieval on first use."""

    def retriever(self, name: str) -> Retriever:
        """Retriever ``name`` (``bm25``, ``dense`` or ``hybrid``) over this corpus."""
        return make_retriever(name, self.index, self.cache_dir, self.key, self.passages)


_libraries: dict[tuple[Path, GeneratedSource | UserSource], Library] = {}
_lock = threading.Lock()


def library(source: GeneratedSource | UserSource, cache_dir: Path) -> Library:
    """The library of ``source``, loaded (and its index built) on first use in this process."""
    key = (cache_dir, source)
    with _lock:
        if key not in _libraries:
            load = _generated if isinstance(source, GeneratedSource) else _user
            _libraries[key] = load(source, cache_dir)  # type: ignore[arg-type]
        return _libraries[key]


def _fingerprint(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _generated(source: GeneratedSource, cache_dir: Path) -> Library:
    kb = KnowledgeBase(source.kb_seed, source.kb_scale, source.distractors)
    key = _fingerprint("kb", GENERATOR_VERSION, source.kb_seed, source.kb_scale, source.distractors)

    def passages() -> list[Passage]:
        return kb.passages

    index = open_index(cache_dir, key, passages)
    tasks: dict[str, list[Task]] = {}
    questions: dict[str, Question] = {}
    prefix = f"kb{source.kb_seed}-x{source.kb_scale}"
    # Validation after test (the wire's split-after-split numbering stays); it skips the
    # questions train holds.
    sizes = (("train", source.n_train), ("test", source.n_test), ("validation", source.n_validation))
    for split, count in sizes:
        tasks[split] = []
        exclude = {questions[t.task_id].question for t in tasks["train"]} if split == "validation" else ()
        for seed, question in kb.questions(split, count, source.hops, exclude):
            task = Task(f"{prefix}/h{question.meta['hops']}/s{seed}", split, {**question.meta, "seed": seed})
            tasks[split].append(task)
            questions[task.task_id] = question
    return Library(index, tasks, questions, cache_dir, key, passages)


def _user(source: UserSource, cache_dir: Path) -> Library:
    stat = os.stat(source.corpus)
    key = _fingerprint("user", os.path.abspath(source.corpus), stat.st_size, stat.st_mtime_ns)
    passages = functools.partial(read_corpus, source.corpus)
    index = open_index(cache_dir, key, passages)
    tasks: dict[str, list[Task]] = {}
    questions: dict[str, Question] = {}
    for split, path in source.questions:
        tasks[split] = []
        for number, question in enumerate(read_questions(path)):
            task = Task(f"{split}/{number}", split, {"source": os.path.basename(path), **question.meta})
            tasks[split].append(task)
            questions[task.task_id] = question
    return Library(index, tasks, questions, cache_dir, key, passages)
