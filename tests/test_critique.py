"""The critique protocol: verdict parsing, Stage I/II rewards, metrics and voting pinned to
hand-computed values, and whole rounds played by small deterministic policies.

The policies below are real :class:`~agentgym.policies.base.Policy` implementations with a
fixed behaviour (an actor that answers from the gold solution except where told to err, a
critic with a fixed stance per question), so every record of a round is known in advance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from agentgym.envs.math.answers import canonical_answer, is_correct
from agentgym.envs.math.env import MathEnv
from agentgym.envs.math.problems import Problem, generate_problem
from agentgym.play.critique import (
    Outcome,
    critic_messages,
    critique_filtered_vote,
    critique_metrics,
    critique_round,
    critique_trajectories,
    discrimination_reward,
    majority_vote,
    parse_verdict,
    refine_messages,
    refinement_reward,
    trajectory_critic_messages,
    voting_accuracy,
)
from agentgym.policies.base import Generation, GenerationRequest, Policy, SamplingParams
from agentgym.records.trajectory import Trajectory

MATH = MathEnv.answer_key


# ----- pure pieces ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("critique", "verdict"),
    [
        ("Step 1 is right.\nVerdict: Correct", True),
        ("Step 2 adds wrongly.\nVerdict: Wrong", False),
        ("**Verdict:** Incorrect.", False),
        ("Verdict - not correct", False),
        ("Judgement: right", True),
        ("Verdict: the answer is incorrect", False),
        ("I must end with 'Verdict: Correct' or 'Verdict: Wrong'.\n...\nVerdict: wrong", False),  # last wins
        ("The steps look correct to me.", None),  # no verdict line
        ("", None),
    ],
)
def test_parse_verdict(critique: str, verdict: bool | None) -> None:
    assert parse_verdict(critique) is verdict


def test_rewards_by_hand() -> None:
    # Stage I: +1 when the verdict matches the truth, -1 when it does not or is missing.
    assert discrimination_reward(True, True) == discrimination_reward(False, False) == 1.0
    assert discrimination_reward(True, False) == discrimination_reward(False, True) == -1.0
    assert discrimination_reward(None, True) == discrimination_reward(None, False) == -1.0
    # Stage II, the paper's table: 1[refined right] + 0.2 * 1[verdict right] (an indicator, not ±1).
    assert refinement_reward(True, False, False) == pytest.approx(1.2)
    assert refinement_reward(True, None, True) == pytest.approx(1.0)
    assert refinement_reward(False, True, True) == pytest.approx(0.2)
    assert refinement_reward(False, True, False) == pytest.approx(0.0)
    assert refinement_reward(False, None, False) == pytest.approx(0.0)
    assert refinement_reward(True, True, True, beta=0.5) == pytest.approx(1.5)


HAND_OUTCOMES = [
    Outcome(answer_correct=True, verdict=True, refined_correct=True),  # judged right, kept
    Outcome(answer_correct=False, verdict=False, refined_correct=True),  # judged right, fixed: i->c
    Outcome(answer_correct=False, verdict=True, refined_correct=False),  # missed error
    Outcome(answer_correct=True, verdict=False, refined_correct=False),  # false alarm broke it: c->i
    Outcome(answer_correct=True, verdict=None, refined_correct=True),  # no verdict
]
HAND_METRICS = {
    "acc": 3 / 5,  # outcomes 0, 3, 4
    "acc_refine": 3 / 5,  # outcomes 0, 1, 4
    "acc_dis": 2 / 5,  # outcomes 0, 1
    "delta": 0.0,  # 3/5 - 3/5 = i2c - c2i = 1/5 - 1/5
    "delta_c2i": 1 / 5,
    "delta_i2c": 1 / 5,
    "verdict_missing": 1 / 5,
    "acc_dis_on_correct": 1 / 3,  # of outcomes 0, 3, 4 only 0 is judged right
    "acc_dis_on_wrong": 1 / 2,  # of outcomes 1, 2 only 1
}
HAND_STAGE1 = [1.0, 1.0, -1.0, -1.0, -1.0]
HAND_STAGE2 = [1.2, 1.2, 0.0, 0.0, 1.0]


def test_metrics_by_hand() -> None:
    assert critique_metrics(HAND_OUTCOMES) == pytest.approx(HAND_METRICS)
    only_right = critique_metrics([Outcome(True, True, True)])
    assert only_right["acc_dis_on_wrong"] is None and only_right["acc_dis"] == 1.0
    with pytest.raises(ValueError, match="at least one"):
        critique_metrics([])


def test_votes_by_hand() -> None:
    assert (
        majority_vote(["12", "1,000", "1000.0", None, "12", "1000"], canonical_answer) == "1,000"
    )  # 3 votes as one number
    assert majority_vote(["7", "8"], canonical_answer) == "7"  # a tie goes to the first seen
    assert majority_vote([None, None], canonical_answer) is None
    # The critic approves only the two "9"s: they win over three "8"s.
    answers = ["8", "9", "8", "9", "8"]
    assert critique_filtered_vote(answers, [False, True, None, True, False], canonical_answer) == "9"
    assert (
        critique_filtered_vote(answers, [False, None, False, False, None], canonical_answer) == "8"
    )  # none approved: all vote
    assert (
        critique_filtered_vote([None, "8"], [True, False], canonical_answer) == "8"
    )  # approving no answer approves nothing
    with pytest.raises(ValueError, match="2 answers but 1 verdicts"):
        critique_filtered_vote(["1", "2"], [True], canonical_answer)


def test_prompts_carry_question_answer_and_critique() -> None:
    critic = critic_messages("What is 2+2?", "  2+2=4.\nThe answer is 4  ")
    assert critic[0]["role"] == "system" and "Verdict: Correct" in critic[0]["content"]
    assert "What is 2+2?" in critic[1]["content"] and "The answer is 4\n" in critic[1]["content"]
    refine = refine_messages(
        "What is 2+2?", "The answer is 5", "Step 1 is wrong.\nVerdict: Wrong", MATH.instruction
    )
    assert [m["role"] for m in refine] == ["system", "user", "assistant", "user"]
    assert refine[2]["content"] == "The answer is 5" and "Verdict: Wrong" in refine[3]["content"]


# ----- deterministic policies (test fixtures following the Policy interface) -----------------


def _question_of(text: str) -> str:
    return text.removeprefix("Question: ").split("\n\nStudent's solution:\n")[0]


class GoldActor:
    """Answers from the gold solution, or with gold + 1 where ``errs(question, seed)``; on a
    refinement it trusts the critic: after "Verdict: Wrong" it switches between the gold and
    the wrong answer, otherwise it repeats its first answer."""

    name = "gold-actor"
    tokenizer = None

    def __init__(self, problems: Sequence[Problem], errs: Callable[[str, int | None], bool]) -> None:
        self.problems = {p.question: p for p in problems}
        self.errs = errs
        self.requests = 0

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        self.requests += len(requests)
        return [Generation(self._reply(r.messages, sampling.seed)) for r in requests]

    def _reply(self, messages: list[dict[str, str]], seed: int | None) -> str:
        problem = self.problems[_question_of(messages[1]["content"])]
        if len(messages) == 2:
            return self._answer(problem, wrong=self.errs(problem.question, seed))
        first = messages[2]["content"]
        if parse_verdict(messages[3]["content"]) is False:
            return self._answer(problem, wrong=is_correct(first, problem.answer))
        return first

    @staticmethod
    def _answer(problem: Problem, wrong: bool) -> str:
        return (
            f"It is {int(problem.answer) + 1}.\nThe answer is {int(problem.answer) + 1}"
            if wrong
            else problem.solution
        )

    async def close(self) -> None:
        """Nothing to release."""


class StanceCritic:
    """Judges by checking the answer against the gold one (``honest``), or always approves,
    always rejects, or gives no verdict, as ``stances`` says per question."""

    name = "stance-critic"
    tokenizer = None

    def __init__(self, problems: Sequence[Problem], stances: dict[str, str]) -> None:
        self.problems = {p.question: p for p in problems}
        self.stances = stances

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        return [Generation(self._critique(r.messages[1]["content"])) for r in requests]

    def _critique(self, prompt: str) -> str:
        question = _question_of(prompt)
        solution = prompt.split("Student's solution:\n")[1]
        stance = self.stances.get(question, "honest")
        if stance == "silent":
            return "Every step looks plausible."
        right = {
            "honest": is_correct(solution, self.problems[question].answer),
            "approve": True,
            "reject": False,
        }
        return f"I checked each step.\nVerdict: {'Correct' if right[stance] else 'Wrong'}"

    async def close(self) -> None:
        """Nothing to release."""


PROBLEMS = [generate_problem(seed, "medium") for seed in range(5)]
STANCES = {PROBLEMS[2].question: "approve", PROBLEMS[3].question: "reject", PROBLEMS[4].question: "silent"}
ERRS = {PROBLEMS[1].question, PROBLEMS[2].question}
"""Problems 1 and 2 are answered wrongly: with the stances, the five rounds of HAND_OUTCOMES."""


def _pair() -> tuple[GoldActor, StanceCritic]:
    return GoldActor(PROBLEMS, lambda q, seed: q in ERRS), StanceCritic(PROBLEMS, STANCES)


async def test_fixture_policies_follow_the_interface() -> None:
    actor, critic = _pair()
    assert isinstance(actor, Policy) and isinstance(critic, Policy)


async def test_a_round_gives_the_hand_computed_outcomes_rewards_and_metrics() -> None:
    actor, critic = _pair()
    records = await critique_round(actor, critic, PROBLEMS, SamplingParams(temperature=0), key=MATH)
    assert [r.outcome for r in records] == HAND_OUTCOMES
    assert [r.stage1_reward for r in records] == HAND_STAGE1
    assert [r.stage2_reward for r in records] == pytest.approx(HAND_STAGE2)
    assert critique_metrics(r.outcome for r in records) == pytest.approx(HAND_METRICS)
    assert actor.requests == 10  # 5 answers + 5 refinements, two batched calls
    first = records[1]
    assert first.problem is PROBLEMS[1] and first.critic_prompt[1]["content"].startswith("Question: ")
    assert first.refined.text == PROBLEMS[1].solution
    assert first.to_dict()["stage2_reward"] == pytest.approx(1.2)
    with pytest.raises(ValueError, match="text backend"):
        first.critic_sample([1, 2])


async def test_a_critique_becomes_a_critic_training_record() -> None:
    actor, critic = _pair()
    (record,) = await critique_round(actor, critic, PROBLEMS[:1], SamplingParams(), key=MATH)
    record.critique = Generation("Verdict: Correct", token_ids=[7, 8, 9], logprobs=[-0.1, -0.2, -0.3])
    assert record.critic_sample([1, 2]) == {
        "token_ids": [1, 2, 7, 8, 9],
        "loss_mask": [0, 0, 1, 1, 1],
        "logprobs": [0.0, 0.0, -0.1, -0.2, -0.3],
    }


async def test_critiques_per_answer_form_rloo_groups() -> None:
    actor, critic = _pair()
    records = await critique_round(
        actor, critic, PROBLEMS[:2], SamplingParams(), n_answers=2, n_critiques=4, key=MATH
    )
    assert len(records) == 2 * 2 * 4
    assert [r.group for r in records[:8]] == [(0, 0)] * 4 + [(0, 1)] * 4
    assert [r.critique_index for r in records[:4]] == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="at least 1"):
        await critique_round(actor, critic, PROBLEMS, SamplingParams(), n_critiques=0, key=MATH)


async def test_refinement_can_be_skipped_when_the_critic_approves() -> None:
    actor, critic = _pair()
    records = await critique_round(
        actor, critic, PROBLEMS, SamplingParams(), refine_when_correct=False, key=MATH
    )
    assert actor.requests == 5 + 3  # problems 0 and 2 were approved: no refinement asked
    assert records[0].refined is records[0].answer and records[2].refined is records[2].answer
    assert [r.outcome for r in records] == HAND_OUTCOMES  # this actor repeats approved answers anyway


async def test_critique_filtered_voting_beats_plain_majority_over_sampled_answers() -> None:
    # Sample seeds 0, 1, 2: problem 0 is answered wrongly twice (seeds 1, 2), problem 1 once.
    wrong = {(PROBLEMS[0].question, 1), (PROBLEMS[0].question, 2), (PROBLEMS[1].question, 0)}
    actor = GoldActor(PROBLEMS[:2], lambda q, seed: (q, seed) in wrong)
    critic = StanceCritic(PROBLEMS[:2], {})
    records = await critique_round(actor, critic, PROBLEMS[:2], SamplingParams(seed=0), n_answers=3, key=MATH)
    # plain: problem 0 votes 2:1 for the wrong answer, problem 1 1:2 for the right one -> 1/2.
    # filtered: the honest critic approves only right answers -> both right.
    assert voting_accuracy(records, MATH) == {"maj": 0.5, "critique_maj": 1.0}


def _choice_episode(action: str, success: bool) -> Trajectory:
    messages = [
        {"role": "system", "content": "Pick the right option.", "loss": False},
        {"role": "user", "content": "Which colour? Options: red, blue.", "loss": False},
        {"role": "assistant", "content": f"Thought: guess.\nAction: {action}", "loss": True},
        {"role": "user", "content": "Correct!" if success else f"Wrong: {action!r}.", "loss": False},
    ]
    return Trajectory("choice", "choice/test/0", "scripted", messages, success=success)


class TranscriptCritic:
    """Approves an episode whose last environment message says ``Correct!``."""

    name = "transcript-critic"
    tokenizer = None

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        texts = [r.messages[1]["content"].rsplit("[Environment]", 1)[1] for r in requests]
        return [Generation(f"Verdict: {'Correct' if 'Correct!' in t else 'Wrong'}") for t in texts]

    async def close(self) -> None:
        """Nothing to release."""


async def test_the_critic_reads_agent_episodes() -> None:
    episodes = [_choice_episode("blue", True), _choice_episode("red", False)]
    prompt = trajectory_critic_messages(episodes[0].messages)[1]["content"]
    assert (
        prompt.index("[Instructions]")
        < prompt.index("[Environment]\nWhich")
        < prompt.index("[Agent]\nThought")
    )
    judged = await critique_trajectories(TranscriptCritic(), episodes, SamplingParams())
    assert [j.verdict for j in judged] == [True, False]
    assert [j.stage1_reward for j in judged] == [1.0, 1.0]
    assert await critique_trajectories(TranscriptCritic(), [], SamplingParams()) == []


async def test_an_always_correct_critic_scores_only_the_share_of_right_answers() -> None:
    # Mixed answers (problems 1 and 2 wrong): a critic approving everything is right on the
    # three correct answers only, so Acc@Dis is 3/5, all on the correct side, none on the wrong.
    actor = GoldActor(PROBLEMS, lambda q, seed: q in ERRS)
    critic = StanceCritic(PROBLEMS, {p.question: "approve" for p in PROBLEMS})
    records = await critique_round(actor, critic, PROBLEMS, SamplingParams(temperature=0), key=MATH)
    metrics = critique_metrics(r.outcome for r in records)
    assert metrics["acc_dis"] == pytest.approx(3 / 5)
    assert metrics["acc_dis_on_correct"] == 1.0 and metrics["acc_dis_on_wrong"] == 0.0


async def test_refinements_use_their_own_sampling() -> None:
    actor, critic = _pair()
    seen: list[float] = []
    generate = actor.generate

    async def recording(requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        seen.append(sampling.temperature)
        return await generate(requests, sampling)

    actor.generate = recording
    greedy = SamplingParams(temperature=0.0)
    await critique_round(
        actor, critic, PROBLEMS, SamplingParams(temperature=1.0), refine_sampling=greedy, key=MATH
    )
    assert seen == [1.0, 0.0]  # answers sampled, refinements greedy (Critique-RL)
