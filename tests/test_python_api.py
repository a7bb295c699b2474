"""Training from Python (``agentgym.trainers.train``), with a custom reward: the hook sees
every finished episode, its score is what the advantages are computed from, and the saved
rollouts keep the env's. Then evaluating the run from Python (``agentgym.api.evaluate``)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from agentgym.api import evaluate
from agentgym.play.evaluation import UsageError
from agentgym.records.trajectory import Trajectory, read_trajectories
from agentgym.trainers import TrainConfig, train
from conftest import TINY_RUN


def test_train_from_python_with_a_custom_reward(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    seen: list[Trajectory] = []

    def first_sample_wins(episode: Trajectory) -> float:
        seen.append(episode)
        # A group is a task's pair of samples (numbered on across steps): one wins, one loses.
        return float(episode.sample % TINY_RUN["group_size"] == 0)

    config = TINY_RUN | {"model": str(tiny_model_dir), "env_url": choice_url, "eval_tasks": 0, "kl_coef": 0.0}
    run = train(config, out=tmp_path / "run", reward=first_sample_wins)
    assert run == (tmp_path / "run").absolute() and (run / "curves.png").is_file()
    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rl = [r for r in steps if r["phase"] == "rl"]
    per_step = TINY_RUN["tasks_per_step"] * TINY_RUN["group_size"]
    assert [r["step"] for r in rl] == [1, 2]
    assert all(r["skipped_episodes"] == 0 for r in rl), rl  # every episode carries gradient
    assert all(r["zero_advantage_share"] == 0 and r["reply_tokens_mean"] > 0 for r in rl), rl
    assert all(r["lr"] > 0 and all(u["grad_norm"] > 0 for u in r["updates"]) for r in rl)  # plotted
    assert len(seen) == 2 * per_step and all(e.token_ids for e in seen)
    played = [t for p in sorted((run / "rollouts").glob("step-*.jsonl")) for t in read_trajectories(p)]
    assert len(played) == len(seen)
    groups: dict[tuple[str, str], set[float]] = {}
    for path in sorted((run / "rollouts").glob("step-*.jsonl")):
        for t in read_trajectories(path):
            groups.setdefault((path.name, t.task_id), set()).add(t.score)
    # By the env's scores (kept in the rollouts) some group ties: its episodes would carry no gradient.
    assert any(len(scores) == 1 for scores in groups.values()), groups
    # Both rewards are logged: the hook's beside the env's, per episode and per step.
    assert [t.shaped_score for t in played] == [first_sample_wins(t) for t in played]
    assert all(r["shaped_reward_mean"] == 0.5 and "reward_mean" in r for r in rl)
    assert TrainConfig.load(run / "config.yaml").env == "choice"

    # Evaluate the run from Python: it plays as the run's held-out evaluation did.
    results = evaluate("choice", run, n=3, url=choice_url, out=tmp_path / "eval", history_turns=1)
    assert results["config"]["history_turns"] == 1
    assert results["tasks"] == 3 and results["ran"] == 3 and results["out_dir"] == str(tmp_path / "eval")
    played = json.loads((run / "play.json").read_text())
    assert (results["format"], results["config"]["max_new_tokens"]) == ("plain", TINY_RUN["max_new_tokens"])
    assert results["config"]["constrain_actions"] == played["constrain_actions"]
    again = evaluate("choice", run, n=3, url=choice_url, out=tmp_path / "eval", history_turns=1)
    assert (again["resumed"], again["ran"], again["success_rate"]) == (3, 0, results["success_rate"])
    with pytest.raises(UsageError, match="played with other settings"):  # would relabel its episodes
        evaluate("choice", run, n=3, url=choice_url, out=tmp_path / "eval", play={"max_new_tokens": 2})


def test_evaluate_refuses_bad_arguments_before_any_server_or_model(tmp_path: Path) -> None:
    start = time.monotonic()
    with pytest.raises(UsageError, match=r"unknown environment 'textwrld' \(did you mean textworld"):
        evaluate("textwrld", out=tmp_path / "a")
    with pytest.raises(UsageError, match="unknown agent format 'prose'"):
        evaluate("choice", play={"agent_format": "prose"}, out=tmp_path / "b")
    with pytest.raises(UsageError, match="unknown play settings max_turn;"):
        evaluate("choice", play={"max_turn": 3}, out=tmp_path / "c")
    with pytest.raises(UsageError, match="constrain_actions needs policy hf or vllm or openai"):
        evaluate("choice", policy="expert", play={"constrain_actions": True}, out=tmp_path / "d")
    assert time.monotonic() - start < 10 and not any(tmp_path.iterdir())
