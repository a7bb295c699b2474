"""Critique-RL's pieces for the trainer (``algo: critique-rl``; docs/algorithms/critique-rl.md).

The trained model is the critic; the actor is the same model with its LoRA adapters
switched off (the frozen base). Steps run in three phases: behaviour cloning on synthetic
critiques built from gold solutions (the warm start that teaches the ``Verdict:`` line),
Stage I (reward: the verdict) and Stage II (reward: the refinement, plus β1 × the verdict,
with a KL penalty to the Stage-I critic).
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from agentgym.critique import CritiqueRecord, critic_messages
from agentgym.envs.math.answers import parse_number
from agentgym.envs.math.problems import Problem
from agentgym.policies.base import Generation, GenerationRequest, Message, SamplingParams
from agentgym.policies.hf import HFPolicy

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


def synthetic_critique(problem: Problem, wrong: bool, rng: random.Random) -> tuple[list[Message], str]:
    """A critic demonstration from a gold solution: the solution itself judged Correct, or
    the solution with its final result perturbed, judged Wrong with the fix named."""
    if not wrong:
        return critic_messages(problem.question, problem.solution), CORRECT_CRITIQUE.format(
            answer=problem.answer
        )
    bad = _perturbed(problem.answer, rng)
    # The last working line and the final line both carry the gold result: change both.
    head, _, tail = problem.solution.rpartition(problem.answer)
    head = head.rpartition(problem.answer)
    solution = f"{head[0]}{bad}{head[2]}{bad}{tail}" if head[1] else f"{head[2]}{bad}{tail}"
    return critic_messages(problem.question, solution), WRONG_CRITIQUE.format(gold=problem.answer, wrong=bad)


def _perturbed(answer: str, rng: random.Random) -> str:
    """A different answer near ``answer`` (a non-numeric answer gets a digit appended)."""
    value = parse_number(answer)
    if value is None:
        return f"{answer}1"
    offset = rng.choice([-3, -2, -1, 1, 2, 3, 10])
    return str(int(value) + offset) if value.denominator == 1 else str(float(value) + offset)


def demonstrations(
    problems: Sequence[Problem], policy: HFPolicy, end_id: int, seed: int
) -> list[dict[str, list[Any]]]:
    """Token records (the ``collate`` format) of synthetic critiques, half Correct and half
    Wrong in random order, each ending with the end-of-turn token."""
    rng = random.Random(seed)
    records = []
    for i, problem in enumerate(problems):
        messages, critique = synthetic_critique(problem, wrong=i % 2 == 1, rng=rng)
        prompt = policy.prompt_ids(messages)
        reply = [*policy.tokenizer.encode(critique, add_special_tokens=False), end_id]
        records.append(
            {
                "token_ids": [*prompt, *reply],
                "loss_mask": [0] * len(prompt) + [1] * len(reply),
                "logprobs": [],
            }
        )
    rng.shuffle(records)
    return records


# ----- the actor and the KL reference ------------------------------------------------------------


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


@contextlib.contextmanager
def swapped_weights(
    parameters: Sequence[torch.nn.Parameter], values: Sequence[torch.Tensor]
) -> Iterator[None]:
    """Run the model with ``values`` in place of ``parameters`` (Stage II's reference: the
    Stage-I critic), then put the current weights back. Autograd reads a parameter's data
    at backward time, after the swap has been undone, so a graph built before it stays right."""
    current = [p.data for p in parameters]
    try:
        for parameter, value in zip(parameters, values, strict=True):
            parameter.data = value
        yield
    finally:
        for parameter, data in zip(parameters, current, strict=True):
            parameter.data = data
