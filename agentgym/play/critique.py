"""Critique-in-the-loop: an actor answers, a critic judges, the actor refines.

The two-player protocol of Critique-RL (arXiv 2510.24320) and AutoMathCritique
(arXiv 2411.16579), as pure pieces plus one async round:

* prompts: :func:`actor_messages`, :func:`critic_messages` (question + answer),
  :func:`trajectory_critic_messages` (an agent episode), :func:`refine_messages`,
  :func:`replay_note` (the critique given to an agent that replays an episode);
* :func:`parse_verdict`: the critic's ``Verdict: Correct`` / ``Verdict: Wrong`` line;
* rewards: :func:`discrimination_reward` (Stage I) and :func:`refinement_reward` (Stage II);
* :func:`critique_metrics`: Acc, Acc@Refine, Acc@Dis, Δ, Δc→i, Δi→c;
* :func:`majority_vote` and :func:`critique_filtered_vote`;
* :func:`critique_round`: actor → critic → actor over a batch of problems through the
  :class:`~agentgym.policies.base.Policy` interface, one batched ``generate`` per stage;
  :func:`voting_accuracy` over its records;
* :func:`critique_trajectories`: the critic reads agent episodes;
  :func:`critique_and_replay`: play, critique, replay with the critique (the protocol on
  agent episodes, e.g. textworld).

Formulas and design choices: docs/algorithms/critique-rl.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentgym.contract.problems import AnswerKey, Problem
from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies.base import Generation, GenerationRequest, Message, Policy, SamplingParams
from agentgym.records.trajectory import Trajectory

STAGE2_VERDICT_WEIGHT = 0.2
"""β1 of Critique-RL's Stage II: the weight of the discrimination reward."""

CRITIC_SYSTEM = (
    "You are a careful teacher checking a student's work. Go through it step by step: for each "
    "step, say whether it is right and, if it is not, what the mistake is and how to fix it. "
    "Then end with exactly one line: 'Verdict: Correct' if the final answer is right, or "
    "'Verdict: Wrong' if it is not."
)
TRAJECTORY_CRITIC_SYSTEM = (
    "You are a careful reviewer of an agent acting in a text environment. Read the episode "
    "below turn by turn: for each action, say whether it helped towards the goal and, if not, "
    "what the agent should have done instead. Then end with exactly one line: "
    "'Verdict: Correct' if the agent completed the task, or 'Verdict: Wrong' if it did not."
)
REFINE_REQUEST = (
    "A teacher reviewed your solution:\n\n{critique}\n\n"
    "Using this feedback, write a corrected solution (keep what was right). End your reply "
    "with the final answer on its own line, as: The answer is N"
)

_VERDICT = re.compile(
    r"(?:verdict|judge?ment)\W{0,6}(?:(?:the\s+)?(?:final\s+)?(?:answer|solution)\s+is\s+)?"
    r"(not\s+correct|incorrect|wrong|false|correct|right|true)",
    re.IGNORECASE,
)
_NEGATIVE = ("not", "incorrect", "wrong", "false")


# ----- prompts -----------------------------------------------------------------------------


def actor_messages(question: str, instruction: str) -> list[Message]:
    """The actor's first attempt at ``question``, under the env's ``instruction``
    (:attr:`AnswerKey.instruction <agentgym.contract.problems.AnswerKey.instruction>`)."""
    return [{"role": "system", "content": instruction}, {"role": "user", "content": f"Question: {question}"}]


def critic_messages(question: str, answer: str) -> list[Message]:
    """The critic's prompt: the question and the actor's whole reply."""
    body = f"Question: {question}\n\nStudent's solution:\n{answer.strip()}\n\nCheck it step by step."
    return [{"role": "system", "content": CRITIC_SYSTEM}, {"role": "user", "content": body}]


def refine_messages(question: str, answer: str, critique: str, instruction: str) -> list[Message]:
    """The actor's second turn: its own first reply stays in the conversation, the critique
    comes as the next user turn."""
    return [
        *actor_messages(question, instruction),
        {"role": "assistant", "content": answer.strip()},
        {"role": "user", "content": REFINE_REQUEST.format(critique=critique.strip())},
    ]


def trajectory_critic_messages(messages: Sequence[Message]) -> list[Message]:
    """The critic's prompt for an agent episode (a :class:`~agentgym.records.trajectory.Trajectory`'s
    ``messages``): the agent's instructions, then every observation and action in order."""
    lines = []
    for message in messages:
        role = {"system": "Instructions", "user": "Environment", "assistant": "Agent"}.get(message["role"])
        if role is not None:
            lines.append(f"[{role}]\n{str(message['content']).strip()}")
    body = "Episode:\n\n" + "\n\n".join(lines) + "\n\nReview the agent's actions step by step."
    return [{"role": "system", "content": TRAJECTORY_CRITIC_SYSTEM}, {"role": "user", "content": body}]


def replay_note(critique: str) -> str:
    """Text added to the first observation when an agent replays an episode with a critique
    of its previous attempt (the agent-env form of refinement)."""
    return f"A reviewer commented on your previous attempt at this task:\n{critique.strip()}\nDo better this time."


# ----- verdicts and rewards -------------------------------------------------------------------


def parse_verdict(critique: str) -> bool | None:
    """``True`` for "Verdict: Correct", ``False`` for "Verdict: Wrong" (also "Incorrect",
    "Not correct", "Judgment: ..." and markdown like ``**Verdict:** Correct``); the last such
    line wins, since critics restate the format before using it. ``None`` when there is none."""
    matches = _VERDICT.findall(critique)
    if not matches:
        return None
    return not matches[-1].lower().startswith(_NEGATIVE)


def discrimination_reward(verdict: bool | None, answer_correct: bool) -> float:
    """Stage I: +1 when the verdict matches the answer's true correctness, -1 when it does not
    or is missing."""
    return 1.0 if verdict is not None and verdict == answer_correct else -1.0


def refinement_reward(
    refined_correct: bool, verdict: bool | None, answer_correct: bool, beta: float = STAGE2_VERDICT_WEIGHT
) -> float:
    """Stage II, the paper's ``1[refined answer correct] + β1 · 1[verdict correct]`` (β1 = 0.2):
    the verdict term is an indicator in {0, 1}, not Stage I's ±1 (that would double its weight)."""
    verdict_correct = verdict is not None and verdict == answer_correct
    return float(refined_correct) + beta * float(verdict_correct)


@dataclass(frozen=True)
class Outcome:
    """What the metrics and rewards need from one actor → critic → actor pass."""

    answer_correct: bool
    verdict: bool | None
    refined_correct: bool

    @property
    def stage1_reward(self) -> float:
        return discrimination_reward(self.verdict, self.answer_correct)

    def stage2_reward(self, beta: float = STAGE2_VERDICT_WEIGHT) -> float:
        return refinement_reward(self.refined_correct, self.verdict, self.answer_correct, beta)


def critique_metrics(outcomes: Iterable[Outcome]) -> dict[str, float | None]:
    """Batch metrics, each a share of all ``N`` outcomes (formulas in docs/algorithms/critique-rl.md):
    ``acc`` (original answers right), ``acc_refine``, ``acc_dis`` (verdict = truth; a missing
    verdict counts as wrong), ``delta = acc_refine - acc = delta_i2c - delta_c2i``,
    ``delta_c2i`` (right → wrong), ``delta_i2c`` (wrong → right), ``verdict_missing``; plus
    ``acc_dis_on_correct`` / ``acc_dis_on_wrong`` (Acc@Dis within each kind of original
    answer; ``None`` when there is none), which show a critic that always says one verdict."""
    outcomes = list(outcomes)
    if not outcomes:
        raise ValueError("critique_metrics needs at least one outcome")
    acc = _share(outcomes, lambda o: o.answer_correct)
    acc_refine = _share(outcomes, lambda o: o.refined_correct)
    return {
        "acc": acc,
        "acc_refine": acc_refine,
        "acc_dis": _share(outcomes, _judged_right),
        "delta": acc_refine - acc,
        "delta_c2i": _share(outcomes, lambda o: o.answer_correct and not o.refined_correct),
        "delta_i2c": _share(outcomes, lambda o: not o.answer_correct and o.refined_correct),
        "verdict_missing": _share(outcomes, lambda o: o.verdict is None),
        "acc_dis_on_correct": _share_or_none([o for o in outcomes if o.answer_correct], _judged_right),
        "acc_dis_on_wrong": _share_or_none([o for o in outcomes if not o.answer_correct], _judged_right),
    }


def _judged_right(outcome: Outcome) -> bool:
    return outcome.verdict is not None and outcome.verdict == outcome.answer_correct


def _share(outcomes: Sequence[Outcome], holds: Callable[[Outcome], bool]) -> float:
    return sum(1 for o in outcomes if holds(o)) / len(outcomes)


def _share_or_none(outcomes: Sequence[Outcome], holds: Callable[[Outcome], bool]) -> float | None:
    return _share(outcomes, holds) if outcomes else None


# ----- voting -------------------------------------------------------------------------------


def majority_vote(answers: Sequence[str | None], canonical: Callable[[str], object]) -> str | None:
    """The most frequent answer (answers with one ``canonical`` key count as one: ``"1,000"`` =
    ``"1000.0"``), ties going to the one seen first; ``None`` when no answer was given."""
    keys = [(canonical(a), a) for a in answers if a is not None]
    if not keys:
        return None
    first_seen: dict[str, str] = {}
    for key, answer in keys:
        first_seen.setdefault(str(key), answer)
    # Counter.most_common keeps first-encountered order among equal counts.
    winner, _ = Counter(str(key) for key, _ in keys).most_common(1)[0]
    return first_seen[winner]


def critique_filtered_vote(
    answers: Sequence[str | None], verdicts: Sequence[bool | None], canonical: Callable[[str], object]
) -> str | None:
    """Majority vote among the answers the critic judged Correct; among all answers when it
    judged none of them (with an answer) Correct."""
    if len(answers) != len(verdicts):
        raise ValueError(f"{len(answers)} answers but {len(verdicts)} verdicts")
    approved = [a for a, verdict in zip(answers, verdicts, strict=True) if verdict is True and a is not None]
    return majority_vote(approved, canonical) if approved else majority_vote(answers, canonical)


# ----- one round ------------------------------------------------------------------------------


@dataclass
class CritiqueRecord:
    """One actor answer, one critique of it and the refinement that critique led to.

    Records of the same problem and answer (``group``) share an answer and differ in the
    critique: the RLOO group when the critic is trained."""

    problem_index: int
    answer_index: int
    critique_index: int
    problem: Problem
    answer: Generation
    critic_prompt: list[Message]
    """The critic's messages (a token backend's ``prompt_ids(critic_prompt)`` is its context)."""
    critique: Generation
    refined: Generation
    """The actor's refinement; the answer itself when refinement was skipped."""
    outcome: Outcome

    @property
    def group(self) -> tuple[int, int]:
        return (self.problem_index, self.answer_index)

    @property
    def stage1_reward(self) -> float:
        return self.outcome.stage1_reward

    @property
    def stage2_reward(self) -> float:
        return self.outcome.stage2_reward()

    def critic_sample(self, prompt_ids: Sequence[int]) -> dict[str, list[Any]]:
        """The critique as a training record for the critic (the trainer's ``collate``
        format): ``prompt_ids`` (the critic's ``prompt_ids(self.critic_prompt)``) then the
        sampled critique tokens, loss and behaviour log-probs on the critique only."""
        tokens, logprobs = self.critique.token_ids, self.critique.logprobs
        if tokens is None or logprobs is None:
            raise ValueError("the critic was a text backend: its critiques carry no token ids to train on")
        return {
            "token_ids": [*prompt_ids, *tokens],
            "loss_mask": [0] * len(prompt_ids) + [1] * len(tokens),
            "logprobs": [0.0] * len(prompt_ids) + list(logprobs),
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record (generations as text, token ids and log-probs)."""
        return {
            **dataclasses.asdict(self),
            "stage1_reward": self.stage1_reward,
            "stage2_reward": self.stage2_reward,
        }


async def critique_round(
    actor: Policy,
    critic: Policy,
    problems: Sequence[Problem],
    sampling: SamplingParams,
    *,
    critic_sampling: SamplingParams | None = None,
    refine_sampling: SamplingParams | None = None,
    n_answers: int = 1,
    n_critiques: int = 1,
    refine_when_correct: bool = True,
    key: AnswerKey,
) -> list[CritiqueRecord]:
    """Actor answers each problem ``n_answers`` times, the critic critiques each answer
    ``n_critiques`` times, the actor refines once per critique.

    Args:
        sampling / critic_sampling: the actor's and the critic's sampling (the critic's
            defaults to the actor's). With a ``seed``, sample ``j`` uses ``seed + j``.
        refine_sampling: the actor's sampling when it refines (default ``sampling``;
            Critique-RL refines greedily).
        refine_when_correct: ``False`` keeps the answer as the refinement when the critic
            says Correct (test-time critique-then-refine); Critique-RL always refines.
        key: the env's answer key (:func:`agentgym.registry.answer_key`): the actor's
            instruction, and whether a reply's final answer is right.

    Returns:
        ``len(problems) * n_answers * n_critiques`` records, problem-major.
    """
    if n_answers < 1 or n_critiques < 1:
        raise ValueError("n_answers and n_critiques must be at least 1")
    check = key.is_correct
    answers = await _sample(
        actor, [actor_messages(p.question, key.instruction) for p in problems], sampling, n_answers
    )
    pairs = [(i, a) for i in range(len(problems)) for a in range(n_answers)]
    prompts = [critic_messages(problems[i].question, answers[i][a].text) for i, a in pairs]
    critiques = await _sample(critic, prompts, critic_sampling or sampling, n_critiques)
    records = [
        _record(problems[i], i, a, c, answers[i][a], prompts[k], critiques[k][c], check)
        for k, (i, a) in enumerate(pairs)
        for c in range(n_critiques)
    ]
    await _refine(actor, records, refine_sampling or sampling, refine_when_correct, key)
    return records


async def _sample(
    policy: Policy, prompts: list[list[Message]], sampling: SamplingParams, n: int
) -> list[list[Generation]]:
    """``n`` generations per prompt: ``result[prompt][sample]``. The ``n`` batched calls run
    concurrently, so a batching backend decodes them together."""
    per_sample = await asyncio.gather(*(_generate(policy, prompts, _nth_seed(sampling, j)) for j in range(n)))
    return [list(samples) for samples in zip(*per_sample, strict=True)]


async def _generate(
    policy: Policy, prompts: list[list[Message]], sampling: SamplingParams
) -> list[Generation]:
    """One batched call answering ``prompts`` in order; no call for no prompts."""
    return await policy.generate([GenerationRequest(m) for m in prompts], sampling) if prompts else []


def _nth_seed(sampling: SamplingParams, j: int) -> SamplingParams:
    return sampling if sampling.seed is None else dataclasses.replace(sampling, seed=sampling.seed + j)


def _record(
    problem: Problem,
    i: int,
    a: int,
    c: int,
    answer: Generation,
    prompt: list[Message],
    critique: Generation,
    check: Callable[[str, str], bool],
) -> CritiqueRecord:
    correct = check(answer.text, problem.answer)
    # Until refined, the refinement is the answer itself (what a skipped refinement keeps).
    outcome = Outcome(correct, parse_verdict(critique.text), correct)
    return CritiqueRecord(i, a, c, problem, answer, prompt, critique, answer, outcome)


async def _refine(
    actor: Policy,
    records: list[CritiqueRecord],
    sampling: SamplingParams,
    refine_when_correct: bool,
    key: AnswerKey,
) -> None:
    todo = [r for r in records if refine_when_correct or r.outcome.verdict is not True]
    prompts = [
        refine_messages(r.problem.question, r.answer.text, r.critique.text, key.instruction) for r in todo
    ]
    refined = await _generate(actor, prompts, sampling)
    for record, generation in zip(todo, refined, strict=True):
        record.refined = generation
        correct = key.is_correct(generation.text, record.problem.answer)
        record.outcome = dataclasses.replace(record.outcome, refined_correct=correct)


def voting_accuracy(records: Sequence[CritiqueRecord], key: AnswerKey) -> dict[str, float]:
    """Per problem, over its sampled answers (first critique of each): plain majority-vote
    accuracy (``maj``) and critique-filtered majority-vote accuracy (``critique_maj``)."""
    by_problem: dict[int, list[CritiqueRecord]] = {}
    for record in records:
        if record.critique_index == 0:
            by_problem.setdefault(record.problem_index, []).append(record)
    if not by_problem:
        raise ValueError("voting_accuracy needs at least one record")
    plain = filtered = 0
    for group in by_problem.values():
        answers = [key.extract(r.answer.text) for r in group]
        gold = group[0].problem.answer
        plain += key.matches(majority_vote(answers, key.canonical), gold)
        verdicts = [r.outcome.verdict for r in group]
        filtered += key.matches(critique_filtered_vote(answers, verdicts, key.canonical), gold)
    return {"maj": plain / len(by_problem), "critique_maj": filtered / len(by_problem)}


# ----- agent episodes ------------------------------------------------------------------------


@dataclass
class TrajectoryCritique:
    """A critique of one agent episode; the truth the verdict is scored against is the
    episode's ``success``."""

    trajectory: Trajectory
    critic_prompt: list[Message]
    critique: Generation
    verdict: bool | None
    replay: Trajectory | None = None
    """The episode played again with the critique (:func:`critique_and_replay`)."""

    @property
    def stage1_reward(self) -> float:
        return self.outcome.stage1_reward

    @property
    def outcome(self) -> Outcome:
        """Success of the first episode, the verdict, success of the replay (the first
        episode's when there was none): what :func:`critique_metrics` reads."""
        refined = self.replay if self.replay is not None else self.trajectory
        return Outcome(self.trajectory.success, self.verdict, refined.success)

    def to_dict(self) -> dict[str, Any]:
        """The episode, the critique, its verdict and the replay, as one JSON record."""
        return {
            "task_id": self.trajectory.task_id,
            "critique": self.critique.text,
            "verdict": self.verdict,
            "episode": self.trajectory.to_dict(),
            "replay": self.replay.to_dict() if self.replay else None,
        }


async def critique_trajectories(
    critic: Policy, trajectories: Sequence[Trajectory], sampling: SamplingParams
) -> list[TrajectoryCritique]:
    """The critic reads each episode (one batched call) and judges whether it succeeded.
    The actor's refinement is a replay of the task with :func:`replay_note` of the critique
    added to its first observation."""
    prompts = [trajectory_critic_messages(t.messages) for t in trajectories]
    critiques = await _generate(critic, prompts, sampling)
    return [
        TrajectoryCritique(t, prompt, critique, parse_verdict(critique.text))
        for t, prompt, critique in zip(trajectories, prompts, critiques, strict=True)
    ]


class NotedPolicy:
    """``policy`` with a note added to the first observation of every conversation it sees,
    the note of that episode (``notes`` by ``(task_id, sample)``, read from the request's
    ``info``): how a replaying agent reads the critique of its previous attempt. Requests
    lose their ``prompt_ids`` so a token backend renders the noted messages (the replay's
    trajectory keeps the env's own observation)."""

    def __init__(self, policy: Policy, notes: Mapping[tuple[str, int], str]) -> None:
        self.policy, self.notes = policy, notes
        self.name, self.tokenizer = policy.name, policy.tokenizer

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        return await self.policy.generate([self._noted(r) for r in requests], sampling)

    def _noted(self, request: GenerationRequest) -> GenerationRequest:
        messages = [dict(m) for m in request.messages]
        first = next(m for m in messages if m["role"] == "user")
        note = self.notes[(request.info["task_id"], request.info["sample"])]
        first["content"] = f"{note}\n\n{first['content']}"
        return GenerationRequest(messages, None, request.info)

    async def close(self) -> None:
        """The wrapped policy is the caller's to close."""


async def critique_and_replay(
    url: str,
    actor: Policy,
    critic: Policy,
    specs: Sequence[EpisodeSpec],
    rollout: RolloutConfig,
    critic_sampling: SamplingParams,
    *,
    token: str | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> list[TrajectoryCritique]:
    """The protocol on agent episodes: the actor plays ``specs`` on the env server at
    ``url``, the critic judges each episode, and the actor replays each task with
    :func:`replay_note` of its critique before the first observation. ``critique_metrics``
    of the results' ``outcome`` gives Acc (first episodes), Acc@Dis and Acc@Refine (replays)."""
    played = await run_episodes(url, actor, specs, rollout, token=token, on_episode=on_episode)
    judged = {
        item.trajectory.key: item for item in await critique_trajectories(critic, played, critic_sampling)
    }
    noted = NotedPolicy(actor, {key: replay_note(item.critique.text) for key, item in judged.items()})
    # One run for all replays, so they share the client and the concurrency cap.
    replay_specs = [EpisodeSpec(t.task_id, t.sample, t.split) for t in played]
    for replay in await run_episodes(url, noted, replay_specs, rollout, token=token, on_episode=on_episode):
        judged[replay.key].replay = replay
    return list(judged.values())
