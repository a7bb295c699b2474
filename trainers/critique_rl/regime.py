"""Critique-RL as a training regime (``algo: critique-rl``; docs/algorithms/critique-rl.md).

The trained model is the critic; the actor is the same model with its LoRA adapters
switched off (the frozen base). Steps run in three phases: behaviour cloning on synthetic
critiques built from gold solutions (the warm start that teaches the ``Verdict:`` line),
Stage I (reward: the verdict, KL to the warm-started critic) and Stage II (reward: the
refinement, plus β1 × 1[verdict right], with a KL penalty to the Stage-I critic).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from agentgym import registry
from agentgym.contract.problems import AnswerKey, Problem
from agentgym.play.critique import CritiqueRecord, critic_messages, critique_metrics, critique_round
from agentgym.policies.base import Generation, GenerationRequest, Message, SamplingParams
from agentgym.policies.chat import end_of_turn_id, reply_ids
from agentgym.policies.hf import HFPolicy
from agentgym.registry import answer_key
from agentgym.trainers.algorithms import ADVANTAGE_ESTIMATORS
from agentgym.trainers.batch import collate
from agentgym.trainers.collector import sampling
from agentgym.trainers.context import TrainingContext
from agentgym.trainers.update import update_policy

CORRECT_CRITIQUE = "Every step checks out and the final answer {answer} is right.\nVerdict: Correct"
WRONG_CRITIQUE = (
    "The last step is wrong: the result should be {gold}, not {wrong}. The answer is {gold}.\nVerdict: Wrong"
)


def stage_of(rl_step: int, stage1_steps: int) -> int:
    """Stage 1 for the first ``stage1_steps`` RL steps (1-based), Stage 2 after."""
    return 1 if rl_step <= stage1_steps else 2


def stage_rewards(records: Sequence[CritiqueRecord], stage: int, beta: float) -> torch.Tensor:
    """Each critique's reward: Stage I the verdict's, Stage II the refinement's (β1 = ``beta``)."""
    if stage == 1:
        return torch.tensor([r.stage1_reward for r in records])
    return torch.tensor([r.outcome.stage2_reward(beta) for r in records])


def rloo_groups(count: int, critiques_per_answer: int) -> torch.Tensor:
    """Group ids of ``count`` records from ``critique_round(n_answers=1)``: records are
    problem-major, so each answer's critiques are one contiguous block (also after the
    ranks' records are concatenated)."""
    return torch.arange(count) // critiques_per_answer


# ----- the warm start ------------------------------------------------------------------------


def synthetic_critique(
    problem: Problem, wrong: bool, rng: random.Random, key: AnswerKey
) -> tuple[list[Message], str]:
    """A critic demonstration from a gold solution: the solution itself judged Correct, or
    the solution with its final result perturbed, judged Wrong with the fix named."""
    if not wrong:
        return critic_messages(problem.question, problem.solution), CORRECT_CRITIQUE.format(
            answer=problem.answer
        )
    bad = _perturbed(problem.answer, rng, key)
    # The last working line and the final line both carry the gold result: change both.
    head, _, tail = problem.solution.rpartition(problem.answer)
    head = head.rpartition(problem.answer)
    solution = f"{head[0]}{bad}{head[2]}{bad}{tail}" if head[1] else f"{head[2]}{bad}{tail}"
    return critic_messages(problem.question, solution), WRONG_CRITIQUE.format(gold=problem.answer, wrong=bad)


def _perturbed(answer: str, rng: random.Random, key: AnswerKey) -> str:
    """A different answer near ``answer`` (a non-numeric answer gets a digit appended)."""
    value = key.number(answer)
    if value is None:
        return f"{answer}1"
    offset = rng.choice([-3, -2, -1, 1, 2, 3, 10])
    return str(int(value) + offset) if value.denominator == 1 else str(float(value) + offset)


def demonstrations(
    problems: Sequence[Problem], policy: HFPolicy, end_id: int, seed: int, key: AnswerKey
) -> list[dict[str, list[Any]]]:
    """Token records (the ``collate`` format) of synthetic critiques, half Correct and half
    Wrong in random order, each ending with the end-of-turn token."""
    rng = random.Random(seed)
    records = []
    for i, problem in enumerate(problems):
        messages, critique = synthetic_critique(problem, wrong=i % 2 == 1, rng=rng, key=key)
        prompt = policy.prompt_ids(messages)
        reply = reply_ids(policy.tokenizer, critique, end_id)
        records.append(
            {
                "token_ids": [*prompt, *reply],
                "loss_mask": [0] * len(prompt) + [1] * len(reply),
                "logprobs": [],
            }
        )
    rng.shuffle(records)
    return records


# ----- the actor and the regime --------------------------------------------------------------------


class BaseModelActor:
    """The frozen actor: the critic's own policy with the LoRA adapters switched off.

    Safe because ``critique_round`` never has actor and critic calls in flight at once: the
    switch is held only while the actor's batch decodes."""

    def __init__(self, policy: HFPolicy, peft_model: Any) -> None:
        self.policy, self.peft_model = policy, peft_model
        self.name = f"{policy.name} (base)"
        self.tokenizer = policy.tokenizer

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        with self.peft_model.disable_adapter():
            return await self.policy.generate(requests, sampling)

    async def close(self) -> None:
        return None


class CritiqueRL:
    """Critique-RL: the frozen actor answers ``tasks_per_step`` train problems, the critic
    critiques each answer ``critiques_per_answer`` times, the actor refines (greedily, as in
    the paper); the critiques' stage rewards become RLOO advantages for a clipped update of
    the critic, with a k3 KL to the policy at the start of the stage (Stage I: ``kl_coef``,
    0.01, to the warm-started critic; Stage II: ``stage2_kl_coef`` to the Stage-I critic)."""

    def __init__(self, run: TrainingContext) -> None:
        self.run = run
        config = run.config
        # The problems behind the server's task ids (same env settings, same problems).
        catalog = registry.make(config.env, **config.env_settings)
        self.key = answer_key(config.env)
        self.train_problems = [catalog.problem(t) for t in run.train_tasks]
        self.test_problems = [catalog.problem(t) for t in run.test_tasks]
        self.validation_problems = [catalog.problem(t) for t in run.validation_tasks]
        self.actor = BaseModelActor(run.learner.policy, run.learner.model)
        self.demos: list[dict[str, Any]] | None = None

    @staticmethod
    def rl_steps(config: Any) -> int:
        return config.critique_rl.stage1_steps + config.critique_rl.stage2_steps

    @staticmethod
    def describe(record: dict[str, Any]) -> str:
        """A step's words on the progress bar."""
        return f"{record['phase']}  acc@dis {record['acc_dis']:.2f}"

    def step(self, step: int) -> dict[str, Any]:
        run, config = self.run, self.run.config
        settings = config.critique_rl
        stage = stage_of(step - config.bc_steps, settings.stage1_steps)
        reference, kl_coef = REFERENCES[stage], config.kl_coef if stage == 1 else settings.stage2_kl_coef
        if kl_coef:
            run.learner.take_reference(run.run_dir.path / reference)
        rng = random.Random(config.seed * 1_000_003 + step)  # same problems after a resume
        problems = rng.sample(self.train_problems, min(config.tasks_per_step, len(self.train_problems)))
        start = time.perf_counter()
        records = run.dp.gather(run.complete(self._round(run.dp.shard(problems), greedy=False)))
        rewards = stage_rewards(records, stage, settings.stage2_beta)
        groups = rloo_groups(len(records), settings.critiques_per_answer)
        advantages = ADVANTAGE_ESTIMATORS[config.advantage]([_Scored(float(r)) for r in rewards], groups)
        samples = [r.critic_sample(run.learner.policy.prompt_ids(r.critic_prompt)) for r in records]
        record = {
            "step": step,
            "phase": f"critique-{stage}",
            "critiques": len(records),
            "reward_mean": float(rewards.mean()),
            **critique_metrics(r.outcome for r in records),
            "rollout_s": round(time.perf_counter() - start, 2),
        }
        start = time.perf_counter()
        record |= update_policy(run, collate(samples, advantages, run.pad_id), kl_coef)
        return record | {"update_s": round(time.perf_counter() - start, 2)}

    async def _round(self, problems: Sequence[Problem], greedy: bool) -> list[CritiqueRecord]:
        config = self.run.config
        return await critique_round(
            self.actor,
            self.run.learner.policy,
            problems,
            sampling(config, greedy),
            refine_sampling=sampling(config, greedy=True),
            n_critiques=1 if greedy else config.critique_rl.critiques_per_answer,
            key=self.key,
        )

    def demonstrations(self) -> list[dict[str, Any]]:
        """Synthetic critiques of ``bc_episodes`` train problems, built once per run."""
        if self.demos is None:
            problems = self.train_problems[: self.run.config.bc_episodes]
            end_id = end_of_turn_id(self.run.tokenizer)
            self.demos = demonstrations(
                problems, self.run.learner.policy, end_id, self.run.config.seed, self.key
            )
        return self.demos

    def evaluate(self, step: int, split: str = "test") -> dict[str, Any]:
        """Greedy critique rounds on the first ``eval_tasks`` test problems (or the first
        ``val_tasks`` validation problems, ``split="validation"``): every
        :func:`~agentgym.play.critique.critique_metrics` figure as ``eval_<name>`` (``val_<name>``),
        and Acc@Refine as ``eval_success_rate`` (``val_success_rate``): the actor's success
        with the critic in the loop."""
        config = self.run.config
        if split == "validation":
            problems, prefix = self.validation_problems[: config.val_tasks], "val"
        else:
            problems, prefix = self.test_problems[: config.eval_tasks], "eval"
        metrics = critique_metrics(r.outcome for r in self.run.complete(self._round(problems, greedy=True)))
        return {f"{prefix}_{key}": value for key, value in metrics.items()} | {
            f"{prefix}_success_rate": metrics["acc_refine"]
        }


REFERENCES = {1: "reference.pt", 2: "stage1-reference.pt"}
"""Each stage's KL reference file in the run folder: the critic as the stage starts."""


@dataclass(frozen=True)
class _Scored:
    """A critique as the advantage estimators see an episode: its reward."""

    score: float
