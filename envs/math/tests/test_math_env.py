"""The `math` env: answer extraction and checking, the generator, GSM8K/MATH loaders, the
episode rules, and the wire contract (expert 100% on the test split over REST)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from agentgym import make
from agentgym.clients.env_client import EnvClient
from agentgym.conformance.runner import run_checks
from agentgym.contract.errors import EpisodeOver
from agentgym.envs.math.answers import answers_match, canonical_answer, extract_answer, parse_number
from agentgym.envs.math.problems import DIFFICULTIES, generate_problem, load_problems
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("She has 48/2 = 24 left.\n#### 1,234", "1,234"),  # GSM8K marker beats everything
        ("so x = \\boxed{\\frac{1}{2}}, i.e. 0.5 = 0.5", "\\frac{1}{2}"),
        ("\\boxed{x^{2}} is the answer", "x^{2}"),  # nested braces kept
        ("2 + 3 = 5.\nThe answer is 42 apples.", "42"),
        ("Answer: -3.5", "-3.5"),
        ("first 3 + 4 = 7, then 7 * 2 = 14.", "14"),  # last number
        ("cut off at \\boxed{12", "12"),  # unbalanced box: the last number
        ("I do not know.", None),
    ],
)
def test_extract_answer(reply: str, expected: str | None) -> None:
    assert extract_answer(reply) == expected


@pytest.mark.parametrize(
    ("predicted", "gold", "same"),
    [
        ("1,234", "1234", True),
        ("3.50", "3.5", True),
        ("7/2", "3.5", True),
        ("\\frac{7}{2}", "3.5", True),
        ("\\dfrac{1}{3}", "1/3", True),
        ("$12", "12", True),
        ("12 apples", "12", True),
        ("-4", "-4.0", True),
        ("0.333", "1/3", False),  # exact rationals: no tolerance
        ("5", "6", False),
        ("\\left(1, 2\\right)", "(1,2)", True),  # symbolic: normalized strings
        (None, "1", False),
    ],
)
def test_answers_match(predicted: str | None, gold: str, same: bool) -> None:
    assert answers_match(predicted, gold) is same


def test_numbers_parse_exactly() -> None:
    assert parse_number("1,000.25") == pytest.approx(1000.25)
    assert parse_number("1/0") is None and parse_number("x + 1") is None
    assert canonical_answer("2.0") == canonical_answer("4/2") == "2"


def test_generated_problems_are_seeded_and_worked() -> None:
    assert generate_problem(7, "hard") == generate_problem(7, "hard")
    assert generate_problem(7, "hard") != generate_problem(8, "hard")
    for name, level in DIFFICULTIES.items():
        for seed in range(40):
            problem = generate_problem(seed, name)
            steps = re.findall(r"^Step \d+:", problem.solution, re.MULTILINE)
            assert level.min_steps <= len(steps) <= level.max_steps
            assert int(problem.answer) >= 0
            assert problem.solution.endswith(f"The answer is {problem.answer}.")
            assert extract_answer(problem.solution) == problem.answer
    with pytest.raises(ValueError, match="unknown difficulty"):
        make("math", difficulty="impossible")


def test_splits_use_disjoint_problems() -> None:
    env = make("math", n_train=50, n_test=20)
    assert env.splits() == {"train": 50, "test": 20, "validation": 100}
    train = {env.problem(t.task_id).question for t in env.tasks("train")}
    assert train.isdisjoint(env.problem(t.task_id).question for t in env.tasks("test"))


def test_one_turn_by_default_and_refinement_turns_with_max_turns() -> None:
    env = make("math", n_train=1, n_test=4)
    gold = env.problem("math/test/0").answer
    _, info = env.reset(task_id="math/test/0")
    _, reward, terminated, truncated, info = env.step(info["expert_action"])
    assert (reward, terminated, truncated, info["success"], info["correct"]) == (1.0, True, False, True, True)
    with pytest.raises(EpisodeOver):
        env.step("The answer is 1")
    env.reset(task_id="math/test/0")
    observation, reward, terminated, _, info = env.step(f"The answer is {int(gold) + 1}")
    assert (reward, terminated, info["lost"], info["gold_answer"]) == (0.0, True, True, gold)

    env.reset(task_id="math/test/0", options={"max_turns": 3})
    observation, _, terminated, _, info = env.step("I am not sure.")
    assert not terminated and "gold_answer" not in info and info["extracted_answer"] is None
    assert "No final answer" in observation and "2 attempts left" in observation
    _, reward, terminated, _, info = env.step(f"Fixed it.\nThe answer is {gold}")
    assert (reward, terminated, info["success"], info["turn"]) == (1.0, True, True, 2)


def _write_jsonl(path: Path, records: list[dict[str, str]]) -> Path:
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n", encoding="utf-8")
    return path


def test_gsm8k_and_math_files_load(tmp_path: Path) -> None:
    gsm8k = _write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            {
                "question": "Natalia sold 48 clips, then half as many. Total?",
                "answer": "48/2 = <<48/2=24>>24\n#### 72",
            }
        ],
    )
    math = _write_jsonl(
        tmp_path / "math.jsonl",
        [
            {"problem": "What is 1/2 + 1/4?", "solution": "We get $\\boxed{\\frac{3}{4}}$."},
            {"problem": "Name the set.", "solution": "It is \\boxed{A}.", "answer": "\\{1, 2\\}"},
        ],
    )
    (problem,) = load_problems(gsm8k)
    assert problem.answer == "72" and "<<" not in problem.solution and problem.source == "gsm8k.jsonl"
    first, second = load_problems(math)
    assert first.answer == "\\frac{3}{4}" and second.answer == "\\{1, 2\\}"  # an answer field wins

    env = make("math", data={"train": gsm8k, "test": math})
    assert env.splits() == {"train": 1, "test": 2}
    _, info = env.reset(task_id="math/test/0")
    assert env.step(info["expert_action"])[4]["success"]
    env.reset(task_id="math/test/0")
    assert env.step("So it is 0.75.")[4]["success"]  # 3/4 checked as a number
    assert make("math", data=gsm8k).splits() == {"test": 1}  # one file: the test split


def test_bad_files_name_the_line(tmp_path: Path) -> None:
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "q", "answer": "a"}, {"text": "?"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:1: GSM8K answer has no"):
        load_problems(bad)
    bad = _write_jsonl(tmp_path / "keys.jsonl", [{"text": "?"}])
    with pytest.raises(ValueError, match=r"keys.jsonl:1: .*'problem' and 'solution'"):
        load_problems(bad)
    with pytest.raises(ValueError, match="data splits"):
        make("math", data={"dev": bad})


def test_math_server_passes_the_contract_and_the_expert_solves_every_test_problem() -> None:
    config = ServerConfig(env="math", env_config={"n_train": 10, "n_test": 30})
    with serve_in_thread(config) as url:
        failed = [r for r in run_checks(url) if not r.passed]
        assert not failed, failed
        with EnvClient(url) as client:
            test_tasks = client.tasks("test", limit=100).tasks
            solved = 0
            for task in test_tasks:
                created = client.create(task.task_id)
                result = client.step(created.session_id, created.info["expert_action"])
                solved += result.info["success"] and result.reward == 1.0 and result.terminated
                client.delete(created.session_id)
    assert solved == len(test_tasks) == 30


@pytest.mark.parametrize("agent_format", ["react", "plain", "json"])
def test_the_expert_solves_math_in_every_agent_format(agent_format: str) -> None:
    """The expert's worked solution is one line, which every agent format can carry (a
    multi-line solution was cut to its first line by react and refused by plain)."""
    import asyncio

    from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
    from agentgym.policies.expert import ExpertPolicy

    with serve_in_thread(ServerConfig(env="math", env_config={"n_train": 4, "n_test": 12})) as url:
        with EnvClient(url) as client:
            specs = [EpisodeSpec(t.task_id, split="test") for t in client.tasks("test", limit=12).tasks]
        episodes = asyncio.run(run_episodes(url, ExpertPolicy(), specs, RolloutConfig(format=agent_format)))
    assert [e.success for e in episodes] == [True] * 12
