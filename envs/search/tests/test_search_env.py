"""SearchEnv on a real tantivy index and real servers on loopback (no mocks): answer
scoring, the generated knowledge base (determinism, splits, retrievable gold hops),
the expert over REST, user corpus and question files end to end, and action handling."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentgym.conformance.runner import run_checks
from agentgym.contract.errors import EpisodeOver, UnknownTask
from agentgym.envs.search import SearchEnv
from agentgym.envs.search.answers import exact_match, f1_score, normalize_answer
from agentgym.envs.search.data import read_corpus, read_questions
from agentgym.envs.search.env import parse_action
from agentgym.envs.search.index import open_index
from agentgym.envs.search.kb import SIZES, TEST_SEED_OFFSET, KnowledgeBase
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

# ----- answer scoring ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("Paris", "paris"),  # case
        ("PARIS", "paris"),
        ("The Glass Harbor", "glass harbor"),  # articles
        ("a cat and an owl", "cat and owl"),
        ("Theatre", "theatre"),  # "the" inside a word stays
        ("Paris!", "paris"),  # punctuation
        ("O'Neill, Jr.", "oneill jr"),
        ("  New \t York\n", "new york"),  # whitespace
        ("The  Lotha-Mar!", "lothamar"),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


def test_exact_match_and_f1_by_hand() -> None:
    assert exact_match("the  glass HARBOR.", ["Glass Harbor"])
    assert not exact_match("Glass Harbor II", ["Glass Harbor"])
    assert exact_match("1987", ["nineteen", "1987"])  # any gold answer counts
    # pred {glass, harbor, ii} vs gold {glass, harbor}: P = 2/3, R = 1, F1 = 0.8
    assert f1_score("The Glass Harbor II", ["Glass Harbor"]) == pytest.approx(0.8)
    # best over golds: vs "Harbor Town" P = 1/2, R = 1/2 -> 0.5; vs "harbor" P = 1/2, R = 1 -> 2/3
    assert f1_score("harbor city", ["Harbor Town", "harbor"]) == pytest.approx(2 / 3)
    assert f1_score("Paris", ["London"]) == 0.0
    assert f1_score("the", ["a"]) == 0.0  # both normalize to nothing


def test_parse_action() -> None:
    assert parse_action("search[Who directed X?]") == ("search", "Who directed X?")
    assert parse_action("  Answer[ Paris ] ") == ("answer", "Paris")
    assert parse_action("open[42]") == ("open", "42")
    assert parse_action("<think>hmm</think><search>capital of Y</search>") == ("search", "capital of Y")
    assert parse_action("I think <answer>Lotha</answer>") == ("answer", "Lotha")
    for bad in ("Paris", "search Paris", "find[Paris]", "search[a] and more"):
        assert parse_action(bad) is None


# ----- the generated knowledge base ---------------------------------------------------------


def test_generation_is_deterministic_by_seed() -> None:
    one, again, other = KnowledgeBase(seed=7), KnowledgeBase(seed=7), KnowledgeBase(seed=8)
    assert one.passages == again.passages
    assert one.questions("test", 20, (1, 2, 3, 4)) == again.questions("test", 20, (1, 2, 3, 4))
    assert one.passages != other.passages
    # Growing a split only appends questions.
    assert one.questions("train", 30, (2,))[:10] == one.questions("train", 10, (2,))


def test_passage_counts_follow_distractors_and_names_are_unique() -> None:
    entities = sum(SIZES.values())
    for distractors in (0, 1, 3):
        kb = KnowledgeBase(seed=1, distractors=distractors)
        assert len(kb.passages) == entities * (1 + distractors)
        assert len({p.doc_id for p in kb.passages}) == len(kb.passages)
    titles = [p.title for p in KnowledgeBase(seed=1, distractors=0).passages]
    assert len(set(titles)) == len(titles)


def test_train_and_test_are_disjoint() -> None:
    kb = KnowledgeBase(seed=0)
    train, test = kb.questions("train", 300, (1, 2, 3, 4)), kb.questions("test", 100, (1, 2, 3, 4))
    assert {id(e) for e in kb.starts("train")}.isdisjoint(id(e) for e in kb.starts("test"))
    assert {q.question for _, q in train}.isdisjoint(q.question for _, q in test)
    assert {q.hop_docs[0] for _, q in train}.isdisjoint(q.hop_docs[0] for _, q in test)
    assert all(seed < TEST_SEED_OFFSET for seed, _ in train)
    assert all(seed >= TEST_SEED_OFFSET for seed, _ in test)


@pytest.mark.parametrize("distractors", [0, 3])
def test_gold_hop_passages_are_retrieved_in_top_k(distractors: int, agentgym_cache: str) -> None:
    """The expert's premise: each gold hop query finds its hop's passage in the top 3."""
    env = SearchEnv(distractors=distractors, n_train=200, n_test=100)
    for split in ("train", "test"):
        for task in env.tasks(split):
            question = env.library.questions[task.task_id]
            assert len(question.hop_queries) == len(question.hop_docs) == task.meta["hops"]
            for query, doc_id in zip(question.hop_queries, question.hop_docs, strict=True):
                top = [hit.passage.doc_id for hit in env.library.index.search(query, env.top_k)]
                assert doc_id in top, (query, top)


def test_question_chains_are_answered_by_their_passages(agentgym_cache: str) -> None:
    """Every hop's answer (the next hop's subject, or the final answer) is in its gold passage."""
    env = SearchEnv(n_train=0, n_test=60)
    hops_seen = set()
    for task in env.tasks("test"):
        question = env.library.questions[task.task_id]
        hops_seen.add(len(question.hop_docs))
        passages = [env.library.index.get(doc_id) for doc_id in question.hop_docs]
        assert question.answers[0] in passages[-1].text
        for passage, next_passage in itertools.pairwise(passages):
            assert next_passage.title in passage.text  # the bridge entity is named
        assert question.answers[0] not in question.question
    assert hops_seen == {1, 2, 3, 4}


# ----- the environment in-process -----------------------------------------------------------


def test_bad_actions_are_explained_and_spend_a_turn(agentgym_cache: str) -> None:
    env = SearchEnv(n_train=4, n_test=4)
    env.reset(task_id=env.tasks("test")[1].task_id, options={"max_turns": 4})
    observation, reward, terminated, truncated, info = env.step("Paris")
    assert "search[query]" in observation and "answer[text]" in observation
    assert (reward, terminated, truncated, info["turn"], info["action_error"]) == (0.0, False, False, 1, True)
    observation, *_, info = env.step("search[ ]")
    assert "needs text" in observation and info["turn"] == 2
    observation, *_, info = env.step("open[no-such-id]")
    assert "No passage has id" in observation and info["turn"] == 3
    *_, terminated, truncated, info = env.step("search[!!!]")  # no words: nothing to match
    assert truncated and not terminated and info["turn"] == 4
    with pytest.raises(EpisodeOver):
        env.step("answer[x]")


def test_expert_recovers_after_a_detour_and_results_show_ids(agentgym_cache: str) -> None:
    env = SearchEnv(n_train=0, n_test=8, hops=(3,))
    task = env.tasks("test")[0]
    question = env.library.questions[task.task_id]
    _, info = env.reset(task_id=task.task_id)
    observation, *_, info = env.step("search[unrelated words about a harbor]")
    assert "(id: " in observation
    assert info["expert_action"] == f"search[{question.hop_queries[0]}]"
    observation, *_, info = env.step(info["expert_action"])
    assert f"(id: {question.hop_docs[0]})" in observation
    assert info["expert_action"] == f"search[{question.hop_queries[1]}]"
    opened, *_ = env.step(f"open[{question.hop_docs[1]}]")  # reading the passage counts
    assert opened.startswith(f"(id: {question.hop_docs[1]})")
    assert env.expert_action() == f"search[{question.hop_queries[2]}]"


def test_unknown_split_and_task(agentgym_cache: str) -> None:
    env = SearchEnv(n_train=2, n_test=2)
    with pytest.raises(UnknownTask):
        env.tasks("holdout")  # ("dev" names validation)
    with pytest.raises(UnknownTask):
        env.reset(task_id="kb0-x1/h1/s999999")
    with pytest.raises(ValueError):
        SearchEnv(distractors=4)
    with pytest.raises(ValueError):
        SearchEnv(hops=(5,))
    with pytest.raises(ValueError):
        SearchEnv(corpus="corpus.jsonl")  # a corpus without questions


def test_index_is_built_once_and_reused(tmp_path: Path) -> None:
    kb = KnowledgeBase(seed=3, distractors=0)
    built = []

    def passages():
        built.append(1)
        return kb.passages

    index = open_index(tmp_path, "k", passages)
    assert len(index) == len(kb.passages) and built == [1]
    assert open_index(tmp_path, "k", passages) is index and built == [1]
    folders = [p.name for p in tmp_path.iterdir()]
    assert folders == ["bm25-v1-k"]  # the temporary build folder is gone


# ----- over REST ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def search_url(agentgym_cache: str) -> Iterator[str]:
    """The built-in search env (default configuration) on loopback."""
    with serve_in_thread(ServerConfig(env="search")) as url:
        yield url


def play_expert(http: httpx.Client, url: str, task_id: str) -> tuple[list[float], dict, int]:
    body = http.post(f"{url}/sessions", json={"task_id": task_id}).json()
    session, info, rewards, turns = body["session_id"], body["info"], [], 0
    while "expert_action" in info:
        step = http.post(f"{url}/sessions/{session}/step", json={"action": info["expert_action"]}).json()
        info, turns = step["info"], turns + 1
        rewards.append(step["reward"])
        assert not step["truncated"]
    http.delete(f"{url}/sessions/{session}")
    return rewards, info, turns


def test_expert_solves_the_whole_test_split_over_rest(search_url: str) -> None:
    with httpx.Client(timeout=30) as http:
        tasks = http.get(f"{search_url}/tasks", params={"split": "test", "limit": 1000}).json()["tasks"]
        assert len(tasks) == 100
        for task in tasks:
            rewards, info, turns = play_expert(http, search_url, task["task_id"])
            assert info["success"] and info["exact_match"] == 1.0 and info["f1"] == 1.0
            assert sum(rewards) == 1.0
            # One search per hop, skipping a hop whose passage an earlier search already showed.
            assert 2 <= turns <= task["hops"] + 1


def test_server_passes_check_env(search_url: str) -> None:
    failed = [r for r in run_checks(search_url) if not r.passed]
    assert not failed, failed


def test_empty_action_is_rejected_over_rest(search_url: str) -> None:
    with httpx.Client(timeout=30) as http:
        session = http.post(f"{search_url}/sessions", json={"split": "test", "index": 0}).json()["session_id"]
        response = http.post(f"{search_url}/sessions/{session}/step", json={"action": "  "})
        assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_action"
        http.delete(f"{search_url}/sessions/{session}")


# ----- user data ------------------------------------------------------------------------------

CORPUS = [
    {
        "id": "w1",
        "contents": '"Aldous Huxley"\nAldous Huxley was an English writer who wrote Brave New World.',
    },
    {"id": "w2", "contents": '"Brave New World"\nBrave New World is a dystopian novel published in 1932.'},
    {"id": "w3", "contents": "The Eiffel Tower is a wrought-iron tower in Paris, finished in 1889."},
    {
        "id": "w4",
        "title": "Mount Everest",
        "contents": "Mount Everest is Earth's highest mountain above sea level.",
    },
]
QUESTIONS = {
    "train": [
        {"id": "t0", "question": "Who wrote Brave New World?", "golden_answers": ["Aldous Huxley", "Huxley"]}
    ],
    "test": [
        {"id": "q0", "question": "When was the Eiffel Tower finished?", "golden_answers": ["1889"]},
        {"question": "What is Earth's highest mountain?", "golden_answers": "Mount Everest"},
    ],
}


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("user-data")
    return {
        "corpus": str(write_jsonl(root / "corpus.jsonl", CORPUS)),
        "questions": {
            split: str(write_jsonl(root / f"{split}.jsonl", rows)) for split, rows in QUESTIONS.items()
        },
    }


def test_loaders_read_flashrag_files(user_files: dict, tmp_path: Path) -> None:
    passages = list(read_corpus(user_files["corpus"]))
    assert [(p.doc_id, p.title) for p in passages] == [
        ("w1", "Aldous Huxley"),
        ("w2", "Brave New World"),
        ("w3", ""),
        ("w4", "Mount Everest"),
    ]
    assert passages[0].text == "Aldous Huxley was an English writer who wrote Brave New World."
    questions = read_questions(user_files["questions"]["test"])
    assert questions[1].answers == ("Mount Everest",) and questions[0].meta == {"id": "q0"}
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "Who?", "golden_answers": []}])
    with pytest.raises(ValueError, match="golden_answers"):
        read_questions(bad)
    (tmp_path / "broken.jsonl").write_text('{"id": 1, "contents": "x"}\nnot json\n')
    with pytest.raises(ValueError, match=r"broken\.jsonl:2"):
        list(read_corpus(tmp_path / "broken.jsonl"))


def test_parquet_questions(user_files: dict, tmp_path: Path) -> None:
    import pyarrow as pa  # the search extra installs it
    import pyarrow.parquet as pq

    path = tmp_path / "test.parquet"
    pq.write_table(
        pa.table({"question": ["Who wrote Brave New World?"], "golden_answers": [["Huxley"]]}), path
    )
    assert read_questions(path)[0].answers == ("Huxley",)


def test_user_corpus_and_questions_end_to_end(user_files: dict) -> None:
    config = ServerConfig(env="search", env_config={**user_files, "top_k": 2})
    with serve_in_thread(config) as url, httpx.Client(timeout=30) as http:
        metadata = http.get(f"{url}/metadata").json()
        assert metadata["splits"] == {"train": 1, "test": 2}
        created = http.post(f"{url}/sessions", json={"split": "test", "index": 0}).json()
        session = created["session_id"]
        assert created["observation"] == "Question: When was the Eiffel Tower finished?"
        assert created["info"]["expert_action"] == "answer[1889]"  # no hops: answer at once

        def step(action: str) -> dict:
            return http.post(f"{url}/sessions/{session}/step", json={"action": action}).json()

        found = step("search[eiffel tower finished]")
        assert found["observation"].splitlines()[1] == "[1] (id: w3)"
        assert "finished in 1889" in found["observation"] and found["reward"] == 0.0
        assert "Mount Everest" in step("open[w4]")["observation"]
        done = step("answer[ 1889. ]")
        assert done["terminated"] and done["reward"] == 1.0 and done["info"]["f1"] == 1.0

        http.post(f"{url}/sessions/{session}/reset", json={"task_id": "train/0"})
        wrong = step("<answer>Julian Huxley</answer>")
        # vs "Huxley": P = 1/2, R = 1 -> F1 = 2/3 (better than vs "Aldous Huxley": 1/2)
        assert wrong["reward"] == 0.0 and wrong["info"]["f1"] == pytest.approx(2 / 3)
        assert wrong["info"]["gold_answers"] == ["Aldous Huxley", "Huxley"]
