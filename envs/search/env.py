"""``SearchEnv``: multi-hop question answering by searching a passage index.

Each turn the agent either searches (``search[query]``: the top-k passages with ids and
titles), reads one passage in full (``open[doc_id]``), or answers (``answer[text]``, which
ends the episode). Reward is exact match after SQuAD normalization; ``info`` adds token
F1. Search-R1's tags (``<search>q</search>``, ``<answer>a</answer>``) are accepted too.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from agentgym.contract.cache import cache_dir as agentgym_cache_dir
from agentgym.contract.core import Task, TaskListsMixin, TextEnv, Transition
from agentgym.contract.dialects import Dialect
from agentgym.envs.search.answers import exact_match, f1_score, normalize_answer
from agentgym.envs.search.data import Question
from agentgym.envs.search.dialect import SEARCHQA_DIALECT
from agentgym.envs.search.index import Hit
from agentgym.envs.search.library import GeneratedSource, Library, UserSource, library
from agentgym.envs.search.retrieval import Retriever, check_retriever

DEFAULT_MAX_TURNS = 10
MAX_OPEN_CHARS = 4000
"""``open`` shows at most this much of a passage (user corpora may hold whole articles)."""

_BRACKET_ACTION = re.compile(r"(search|open|answer)\s*\[(.*)\]", re.IGNORECASE | re.DOTALL)
_TAG_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)

INSTRUCTION = """\
Answer the question by searching a collection of encyclopedia passages. Questions may \
need several searches: find one fact, then search for the next using what you learned.

Each turn, reply with exactly one action:
- search[query]: show the best matching passages, each with its id and title
- open[doc_id]: show one passage in full
- answer[text]: give your final answer (short: a name, a place, a year); this ends the episode

Example: search[Who directed the film The Glass Harbor?]"""

BAD_ACTION = (
    "Unrecognised action {action!r}. Reply with exactly one of search[query], open[doc_id] or answer[text]."
)


def parse_action(action: str) -> tuple[str, str] | None:
    """``(verb, argument)`` of ``search[...]``, ``open[...]``, ``answer[...]`` (the whole
    reply) or a Search-R1 tag anywhere in it; ``None`` for anything else."""
    match = _BRACKET_ACTION.fullmatch(action.strip()) or _TAG_ACTION.search(action)
    return (match.group(1).lower(), match.group(2).strip()) if match else None


class SearchEnv(TaskListsMixin, TextEnv):
    """Question answering over a passage index: BM25, dense embeddings, or both fused.

    By default the questions and passages come from the generated knowledge base
    (:mod:`agentgym.envs.search.kb`); pass ``corpus`` and ``questions`` to use your own.

    Args:
        n_train / n_validation / n_test: generated questions per split (validation: from
            train's start entities, none of train's questions; test: its own entities).
        hops: hop counts to cycle through, question by question (1 to 4).
        distractors: distractor passages per entity in the generated corpus (0 to 3).
        kb_seed / kb_scale: the generated world's seed and size multiplier (~1.4k
            passages at scale 1 with 2 distractors).
        corpus: a corpus JSONL file (``id``, ``contents``) to search instead.
        questions: question files (JSONL or Parquet with ``question``,
            ``golden_answers``) for ``corpus``: ``{"train": path, "validation": path,
            "test": path}`` (any split names), or one path, which becomes the ``test`` split.
        top_k: passages per search.
        retriever: ``"bm25"`` (default), ``"dense"`` (all-MiniLM-L6-v2 embeddings) or
            ``"hybrid"`` (reciprocal-rank fusion of the two); dense and hybrid need the
            ``search-dense`` extra (see :mod:`agentgym.envs.search.retrieval`).
        max_passage_chars: search results cut passages to this length.
        cache_dir: where indexes and embeddings are cached (default ``$AGENTGYM_CACHE/search``).
        max_turns: turn limit (default 10).
    """

    name: ClassVar[str] = "search"
    description: ClassVar[str] = (
        "Multi-hop question answering over a passage index (BM25, dense or hybrid): search, read, answer "
        "(exact match after SQuAD normalization)."
    )
    action_format: ClassVar[str] = "search[query] | open[doc_id] | answer[text]"
    default_max_turns: ClassVar[int] = DEFAULT_MAX_TURNS
    compat_dialect: ClassVar[Dialect] = SEARCHQA_DIALECT

    def __init__(
        self,
        *,
        n_train: int = 500,
        n_test: int = 100,
        n_validation: int = 100,
        hops: Sequence[int] = (1, 2, 3, 4),
        distractors: int = 2,
        kb_seed: int = 0,
        kb_scale: int = 1,
        corpus: str | os.PathLike[str] | None = None,
        questions: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]] | None = None,
        top_k: int = 3,
        retriever: str = "bm25",
        max_passage_chars: int = 500,
        cache_dir: str | os.PathLike[str] | None = None,
        max_turns: int | None = None,
    ) -> None:
        super().__init__(max_turns=max_turns)
        if top_k < 1 or max_passage_chars < 1:
            raise ValueError("top_k and max_passage_chars must be positive")
        check_retriever(retriever)  # before the corpus is built
        self.top_k, self.max_passage_chars = top_k, max_passage_chars
        source = _source(
            corpus,
            questions,
            GeneratedSource(kb_seed, kb_scale, distractors, tuple(hops), n_train, n_test, n_validation),
        )
        self.library: Library = library(
            source, Path(cache_dir) if cache_dir else agentgym_cache_dir("search")
        )
        self.retriever: Retriever = self.library.retriever(retriever)
        self._tasks = self.library.tasks  # splits() and tasks() read it (TaskListsMixin)
        self._question: Question | None = None
        self._seen_docs: set[str] = set()
        self._issued: set[str] = set()

    # ----- catalogue -------------------------------------------------------------------

    def instruction(self) -> str:
        return INSTRUCTION

    # ----- episode ---------------------------------------------------------------------

    def _reset(self, task: Task, seed: int | None, options: dict[str, Any]) -> Transition:
        self._question = self.library.questions[task.task_id]
        self._seen_docs, self._issued = set(), set()
        return Transition(f"Question: {self._question.question}", score=0.0)

    def _step(self, action: str) -> Transition:
        parsed = parse_action(action)
        if parsed is None or not parsed[1]:
            text = (
                BAD_ACTION.format(action=action[:200])
                if parsed is None
                else f"{parsed[0]}[...] needs text inside the brackets."
            )
            return Transition(text, score=0.0, extra={"action_error": True})
        verb, argument = parsed
        if verb == "answer":
            return self._answer(argument)
        observation = self._search(argument) if verb == "search" else self._open(argument)
        return Transition(observation, score=0.0)

    def _search(self, query: str) -> str:
        self._issued.add(normalize_answer(query))
        hits = self.retriever.search(query, self.top_k)
        self._seen_docs.update(hit.passage.doc_id for hit in hits)
        if not hits:
            return f"No passages match {query!r}. Try other words."
        return f"Results for {query!r}:\n" + "\n".join(
            self._render(rank, hit) for rank, hit in enumerate(hits, 1)
        )

    def _render(self, rank: int, hit: Hit) -> str:
        text = hit.passage.text
        if len(text) > self.max_passage_chars:
            text = text[: self.max_passage_chars].rsplit(" ", 1)[0] + " ..."
        return f"[{rank}] (id: {hit.passage.doc_id}) {hit.passage.title}".rstrip() + f"\n{text}"

    def _open(self, doc_id: str) -> str:
        passage = self.library.index.get(doc_id)
        if passage is None:
            return f"No passage has id {doc_id!r}. Use an id shown in search results."
        self._seen_docs.add(doc_id)
        return f"(id: {passage.doc_id}) {passage.title}".rstrip() + f"\n{passage.text[:MAX_OPEN_CHARS]}"

    def _answer(self, answer: str) -> Transition:
        assert self._question is not None
        golds = self._question.answers
        correct = exact_match(answer, golds)
        verdict = "correct" if correct else "wrong"
        return Transition(
            f"Your answer {answer!r} is {verdict}.",
            score=1.0 if correct else 0.0,
            won=correct,
            lost=not correct,
            extra={"exact_match": float(correct), "f1": f1_score(answer, golds), "gold_answers": list(golds)},
        )

    def expert_action(self) -> str | None:
        """The first gold hop whose passage has not been shown yet (and whose query was
        not issued yet), as a search; then the first gold answer. Recomputed from what the
        episode has shown, so it stays right after the agent strays. User questions carry
        no hops: the expert answers at once."""
        question = self._question
        if question is None or self.done:
            return None
        for query, doc_id in zip(question.hop_queries, question.hop_docs, strict=True):
            if doc_id not in self._seen_docs and normalize_answer(query) not in self._issued:
                return f"search[{query}]"
        return f"answer[{question.answers[0]}]"


def _source(
    corpus: str | os.PathLike[str] | None,
    questions: str | os.PathLike[str] | Mapping[str, str | os.PathLike[str]] | None,
    generated: GeneratedSource,
) -> GeneratedSource | UserSource:
    if corpus is None and questions is None:
        return generated
    if corpus is None or questions is None:
        raise ValueError("a user corpus needs question files and vice versa: pass both corpus and questions")
    by_split = questions if isinstance(questions, Mapping) else {"test": questions}
    if not by_split:
        raise ValueError("questions must name at least one split")
    return UserSource(os.fspath(corpus), tuple((split, os.fspath(path)) for split, path in by_split.items()))
