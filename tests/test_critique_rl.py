"""Critique-RL end to end with a tiny random model: the trainer's warm start and two
stages, ``agentgym eval --critic``, and the protocol on textworld episodes."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.envs.math.answers import is_correct
from agentgym.envs.math.env import MathEnv
from agentgym.envs.math.problems import generate_problem
from agentgym.play.critique import critique_and_replay, critique_metrics, parse_verdict
from agentgym.play.evaluation import list_tasks
from agentgym.play.rollout import EpisodeSpec, RolloutConfig
from agentgym.policies import make_policy
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.critique_rl.regime import synthetic_critique
from agentgym.trainers.loop import Trainer
from conftest import run_metrics


def test_synthetic_critiques_judge_the_gold_and_a_perturbed_solution() -> None:
    problem = generate_problem(3, "medium")
    rng = random.Random(0)
    (_, right_prompt), right = synthetic_critique(problem, wrong=False, rng=rng, key=MathEnv.answer_key)
    (_, wrong_prompt), wrong = synthetic_critique(problem, wrong=True, rng=rng, key=MathEnv.answer_key)
    assert parse_verdict(right) is True and parse_verdict(wrong) is False
    assert is_correct(right_prompt["content"], problem.answer)
    assert not is_correct(wrong_prompt["content"], problem.answer)
    assert f"should be {problem.answer}" in wrong


def test_critique_rl_runs_warm_start_then_both_stages(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = TrainConfig(
        algo="critique-rl",
        env="math",
        env_settings={"n_train": 8, "n_test": 4, "difficulty": "easy"},
        model=str(tiny_model_dir),
        bc_steps=1,
        bc_episodes=4,
        critique_rl={"stage1_steps": 1, "stage2_steps": 1, "critiques_per_answer": 2, "stage2_kl_coef": 0.1},
        tasks_per_step=2,
        max_new_tokens=6,
        minibatch_size=4,
        micro_batch_size=4,
        eval_every=0,
        eval_tasks=2,
    )
    run = Trainer(config, tmp_path / "run").run()
    history = run_metrics(run)
    assert [r["phase"] for r in history] == ["bc", "critique-1", "critique-2"]
    for record in history[1:]:
        assert record["critiques"] == 4
        for key in ("acc", "acc_refine", "acc_dis", "delta", "delta_c2i", "delta_i2c"):
            assert 0 <= record[key] <= 1 or key.startswith("delta")
        assert record["updates"]
        # Stage II's reward is 1[refined right] + 0.2·1[verdict right]: never negative.
        assert record["reward_mean"] >= 0 or record["phase"] == "critique-1"
    final = history[-1]
    assert {"eval_acc_dis", "eval_acc_refine", "eval_delta"} <= set(final)
    # Each stage's KL reference is the critic as the stage starts: Stage I's the warm-started
    # critic (the step-1 checkpoint), Stage II's the Stage-I critic (step 2), never the base.
    for reference, step in (("reference.pt", 1), ("stage1-reference.pt", 2)):
        snapshot = torch.load(run / reference, weights_only=True)
        trained = torch.load(run / f"checkpoints/step-{step:06d}/trainable.pt", weights_only=True)
        assert all(torch.equal(s, t) for s, t in zip(snapshot, trained.values(), strict=True))
        # LoRA's B matrices start at zero (the base model): the references have moved away.
        moved = [s for s, name in zip(snapshot, trained, strict=True) if "lora_B" in name]
        assert moved and any(t.abs().sum() > 0 for t in moved)
    assert config.kl_coef == 0.01  # Critique-RL's Stage-I KL, the paper's value


def test_eval_with_a_critic_reports_critique_metrics(tiny_model_dir: Path, tmp_path: Path) -> None:
    args = ["eval", "--env", "math", "--model", str(tiny_model_dir), "--critic", str(tiny_model_dir)]
    args += ["--n", "2", "--k", "2", "--max-new-tokens", "4", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["problems"] == 2 and results["k"] == 2
    assert {"acc", "acc_dis", "acc_refine", "delta_c2i", "delta_i2c", "maj", "critique_maj"} <= set(results)
    assert len((tmp_path / "critiques.jsonl").read_text().splitlines()) == 4
    assert "acc_refine" in result.output


def test_eval_with_a_critic_on_textworld_critiques_and_replays_episodes(
    tiny_model_dir: Path, textworld_url: str, tmp_path: Path
) -> None:
    args = ["eval", "--env", "textworld", "--url", textworld_url, "--model", str(tiny_model_dir)]
    args += ["--critic", str(tiny_model_dir), "--n", "2", "--max-turns", "2", "--max-new-tokens", "4"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["episodes"] == 2 and {"acc", "acc_dis", "acc_refine"} <= set(results)
    records = [json.loads(line) for line in (tmp_path / "critiques.jsonl").read_text().splitlines()]
    assert [r["replay"]["task_id"] for r in records] == [r["episode"]["task_id"] for r in records]
    math_with_url = ["eval", "--env", "math", "--url", textworld_url, "--critic", str(tiny_model_dir)]
    assert CliRunner().invoke(app, math_with_url).exit_code == 2


class NoteSpy:
    """The expert, recording the first observation of every conversation it is asked about."""

    def __init__(self) -> None:
        self.expert = make_policy("expert")
        self.name, self.tokenizer = "spy", None
        self.first_observations: list[str] = []

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        self.first_observations += [r.messages[1]["content"] for r in requests]
        return await self.expert.generate(requests, sampling)

    async def close(self) -> None:
        """Nothing to release."""


class ApprovingCritic:
    """Approves every episode after one line of feedback."""

    name, tokenizer = "approving-critic", None

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        return [Generation("Every action moved towards the goal.\nVerdict: Correct") for _ in requests]

    async def close(self) -> None:
        """Nothing to release."""


async def test_the_protocol_runs_on_textworld_episodes(textworld_url: str) -> None:
    specs = [EpisodeSpec(task, split="test") for task in await list_tasks(textworld_url, "test", 2)]
    actor = NoteSpy()
    judged = await critique_and_replay(
        textworld_url, actor, ApprovingCritic(), specs, RolloutConfig(max_turns=30), SamplingParams()
    )
    assert [j.trajectory.task_id for j in judged] and all(j.trajectory.success for j in judged)
    assert all(j.replay is not None and j.replay.success for j in judged)
    assert sum("A reviewer commented" in o for o in actor.first_observations) >= len(specs)
    metrics = critique_metrics(j.outcome for j in judged)
    assert metrics["acc"] == metrics["acc_refine"] == metrics["acc_dis"] == 1.0
