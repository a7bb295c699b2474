"""The rollout engine on a real textworld server, with the real default model and tokenizer:
exact token accounting, template drift detection, parse failures, per-episode errors, the
free-running vs lock-step schedules; and the trajectory store and AgentGym format."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("textworld")
pytest.importorskip("transformers")

from agentgym.agents.tokens import encode, render
from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.expert import ExpertPolicy
from agentgym.policies.hf import HFPolicy
from agentgym.records.trajectory import (
    AGENTGYM_ACK,
    Trajectory,
    TrajectoryWriter,
    from_agentgym,
    read_jsonl,
    read_trajectories,
    to_agentgym,
)

COIN = "tw-coin_collector/level1/s1000000"
"""One-step test task (expert: take coin)."""
HUNT = "tw-treasure_hunter/level3/s1000005"
SIMPLE = "tw-simple/dense-detailed/s1000002"
"""Eight expert steps."""


@pytest.fixture(scope="module")
def hf() -> Iterator[HFPolicy]:
    policy = HFPolicy("smollm2-135m", device="cpu")
    yield policy
    asyncio.run(policy.close())


class ScriptedTokenPolicy:
    """A token-level policy that replies with fixed texts, tokenized canonically with a real
    tokenizer (plus end-of-turn unless ``cut``): exact re-render checks need canonical ids."""

    def __init__(self, tokenizer: Any, replies: list[str], cut: bool = False) -> None:
        self.name, self.tokenizer, self.replies, self.cut = "scripted", tokenizer, replies, cut
        self.calls = 0

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        out = []
        for request in requests:
            assert request.prompt_ids is not None
            text = self.replies[self.calls % len(self.replies)]
            self.calls += 1
            ids = encode(self.tokenizer, text) + (
                [] if self.cut else [self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
            )
            out.append(Generation(text, ids, [-0.5] * len(ids), "length" if self.cut else "stop"))
        return out

    async def close(self) -> None:
        pass


class TextPolicy:
    """A text-level policy that always gives the same reply and records what it was shown."""

    tokenizer = None

    def __init__(self, reply: str) -> None:
        self.name, self.reply, self.shown = "fixed-text", reply, []

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        self.shown += [request.messages for request in requests]
        return [Generation(self.reply) for _ in requests]

    async def close(self) -> None:
        pass


class TimedExpert(ExpertPolicy):
    """The expert, taking ``delay`` seconds per reply and logging (task, turn) per call;
    raises for ``broken_task`` (a policy failure confined to one episode)."""

    def __init__(self, delay: float = 0.0, broken_task: str | None = None) -> None:
        self.delay, self.broken_task, self.calls = delay, broken_task, []

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        for request in requests:
            self.calls.append((request.info["task_id"], request.info["turn"]))
            if request.info["task_id"] == self.broken_task:
                raise RuntimeError("backend exploded")
        await asyncio.sleep(self.delay)
        return await super().generate(requests, sampling)


def play(url: str, policy: Any, tasks: list[str | EpisodeSpec], **config: Any) -> list[Trajectory]:
    specs = [task if isinstance(task, EpisodeSpec) else EpisodeSpec(task, 0, "test") for task in tasks]
    return asyncio.run(run_episodes(url, policy, specs, RolloutConfig(**config)))


def masked_segments(trajectory: Trajectory) -> list[list[int]]:
    segments: list[list[int]] = []
    previous = 0
    for token, mask in zip(trajectory.token_ids, trajectory.loss_mask, strict=True):
        if mask and not previous:
            segments.append([])
        if mask:
            segments[-1].append(token)
        previous = mask
    return segments


def assert_exact_accounting(trajectory: Trajectory, tokenizer: Any) -> None:
    ids, mask, logprobs = trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs
    assert len(ids) == len(mask) == len(logprobs)
    assert sum(mask) == trajectory.generated_tokens > 0
    assert all(lp <= 0 for lp, m in zip(logprobs, mask, strict=True) if m)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask, strict=True) if not m)
    replies = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
    assert [tokenizer.decode(s, skip_special_tokens=True) for s in masked_segments(trajectory)] == replies
    prompt = encode(tokenizer, render(tokenizer, trajectory.messages[:2]))
    assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])


# ----- token accounting ------------------------------------------------------------------


def test_token_accounting_is_exact_with_the_real_model(textworld_url: str, hf: HFPolicy) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=3)
    specs = [EpisodeSpec(COIN, 0), EpisodeSpec(COIN, 1), EpisodeSpec(HUNT, 0)]
    trajectories = play(textworld_url, hf, specs, max_turns=2, sampling=sampling)
    assert len(trajectories) == 3
    for trajectory in trajectories:
        assert trajectory.turns == len(masked_segments(trajectory)) >= 1
        assert_exact_accounting(trajectory, hf.tokenizer)
        assert not trajectory.template_drift
        # What the model saw is the chat template of the recorded conversation, character for
        # character (sampled tokens may split text non-canonically, so compare the text).
        seen = hf.tokenizer.decode(trajectory.token_ids, skip_special_tokens=False)
        assert seen == render(hf.tokenizer, trajectory.messages)
    # A run seed is varied per sample: the two samples of one task are not copies.
    first, second = (next(t for t in trajectories if t.key == (COIN, i)) for i in (0, 1))
    assert first.messages[2]["content"] != second.messages[2]["content"]


def test_constrained_episodes_play_only_valid_commands(textworld_url: str, hf: HFPolicy) -> None:
    """The untrained model mostly narrates or invents commands; constrained to the valid
    ones, every turn plays one, and the accounting stays exact."""
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=5)
    specs = [EpisodeSpec(SIMPLE, 0), EpisodeSpec(HUNT, 0)]
    free = play(textworld_url, hf, specs, max_turns=3, sampling=sampling, show_actions=True)
    assert sum(t.invalid_turns for t in free) > 0
    bound = play(
        textworld_url, hf, specs, max_turns=3, sampling=sampling, show_actions=True, constrain_actions=True
    )
    for trajectory in bound:
        assert trajectory.turns >= 1 and trajectory.invalid_turns == 0
        replies = [m["content"] for m in trajectory.messages if m["role"] == "assistant"]
        assert all(reply.startswith("Action: ") for reply in replies)
        assert_exact_accounting(trajectory, hf.tokenizer)
        assert not trajectory.template_drift


@pytest.mark.parametrize("cut", [False, True], ids=["end-of-turn", "cut-at-max-tokens"])
def test_incremental_ids_equal_the_full_render_for_chatml(
    textworld_url: str, hf: HFPolicy, cut: bool
) -> None:
    replies = ["Thought: look around first.\nAction: look", "Action: take coin", "no idea"]
    policy = ScriptedTokenPolicy(hf.tokenizer, replies, cut=cut)
    (trajectory,) = play(textworld_url, policy, [SIMPLE], max_turns=3)
    assert trajectory.end_reason == "truncated" and trajectory.actions == ["look", "take coin", None]
    assert_exact_accounting(trajectory, hf.tokenizer)
    assert trajectory.token_ids == encode(hf.tokenizer, render(hf.tokenizer, trajectory.messages))
    assert not trajectory.template_drift


def test_a_template_that_rewrites_earlier_turns_is_flagged(
    textworld_url: str, hf: HFPolicy, caplog: pytest.LogCaptureFixture
) -> None:
    tokenizer = copy.deepcopy(hf.tokenizer)
    # Like reasoning models' templates: earlier assistant turns lose their thoughts.
    tokenizer.chat_template = tokenizer.chat_template.replace(
        "message['content']",
        "(message['content'].split('Action:')[-1] if message['role'] == 'assistant' and not loop.last "
        "else message['content'])",
    )
    policy = ScriptedTokenPolicy(tokenizer, ["Thought: hmm.\nAction: look"])
    with caplog.at_level(logging.WARNING, logger="agentgym.agents.tokens"):
        trajectories = play(textworld_url, policy, [SIMPLE, HUNT], max_turns=2)
    for trajectory in trajectories:
        assert trajectory.template_drift
        assert_exact_accounting(trajectory, tokenizer)  # the record is still what the model saw
    assert sum("does not preserve earlier turns" in r.message for r in caplog.records) == 1


# ----- parsing and errors ----------------------------------------------------------------


def test_garbage_replies_spend_turns_and_never_crash(textworld_url: str) -> None:
    policy = TextPolicy("I would love to play this game!")
    (trajectory,) = play(textworld_url, policy, [COIN], max_turns=3, history_turns=1)
    assert trajectory.end_reason == "truncated" and trajectory.turns == 3
    assert trajectory.actions == [None, None, None] and trajectory.rewards == [0.0, 0.0, 0.0]
    feedback = [m["content"] for m in trajectory.messages[3::2]]
    assert len(feedback) == 3 and all("no line starting with 'Action:'" in f for f in feedback)
    assert trajectory.token_ids is None and not trajectory.success
    # The window: system + first observation + the last turn.
    assert [len(shown) for shown in policy.shown] == [2, 4, 4]
    assert len(trajectory.messages) == 8


def test_errors_end_only_their_episode(textworld_url: str) -> None:
    policy = TimedExpert(broken_task=HUNT)
    trajectories = play(textworld_url, policy, [COIN, "tw-coin_collector/no-such-task", HUNT, SIMPLE])
    by_task = {t.task_id: t for t in trajectories}
    assert by_task["tw-coin_collector/no-such-task"].end_reason == "error:env_task_not_found"
    assert by_task[HUNT].end_reason == "error:generation" and "backend exploded" in by_task[HUNT].error
    for task in (COIN, SIMPLE):
        assert by_task[task].end_reason == "terminated" and by_task[task].success


def test_slow_generation_times_out_its_episode(textworld_url: str) -> None:
    (trajectory,) = play(textworld_url, TimedExpert(delay=1.0), [COIN], generation_timeout=0.2)
    assert trajectory.end_reason == "error:generation_timeout" and trajectory.turns == 0


def test_a_server_that_cannot_be_reached_fails_the_run_at_once() -> None:
    # Nothing can be played without /metadata: the caller (the CLI: exit 2) decides, not each episode.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with pytest.raises(httpx.ConnectError):
        asyncio.run(run_episodes(dead, ExpertPolicy(), [EpisodeSpec(COIN)]))


# ----- scheduling ------------------------------------------------------------------------


def test_free_running_episodes_never_wait_for_each_other(textworld_url: str) -> None:
    tasks = [SIMPLE, COIN, HUNT, COIN.replace("s1000000", "s1000012")]
    play(textworld_url, ExpertPolicy(), tasks, concurrency=4)  # games generated first: no reset waits on one
    # A slow policy (0.2 s a reply): the long episode outlasts the others' resets, so whether
    # they ran beside it does not depend on the machine's speed.
    policy = TimedExpert(delay=0.2)
    trajectories = play(textworld_url, policy, tasks, concurrency=2)
    assert all(t.success for t in trajectories)
    # The short episodes (1-2 turns) finished and a queued one started while the long one ran.
    long_turns = [i for i, (task, _) in enumerate(policy.calls) if task == SIMPLE]
    queued_start = policy.calls.index((tasks[3], 0))
    assert queued_start < long_turns[-1]
    assert [t.task_id for t in trajectories][-1] == SIMPLE


def test_lockstep_groups_step_together(textworld_url: str) -> None:
    policy = TimedExpert(delay=0.01)
    tasks = [SIMPLE, COIN, HUNT, COIN.replace("s1000000", "s1000012")]
    trajectories = play(textworld_url, policy, tasks, concurrency=2, barrier=True)
    assert all(t.success for t in trajectories)
    # The second group starts only after the first group's slowest episode ended, and
    # within a group every turn-t call comes before any turn-(t+1) call.
    first_group = policy.calls[: next(i for i, c in enumerate(policy.calls) if c[0] in tasks[2:])]
    assert {task for task, _ in first_group} == set(tasks[:2])
    assert [turn for _, turn in first_group] == sorted(turn for _, turn in first_group)


# ----- the trajectory store --------------------------------------------------------------


def sample_trajectory(task: str = COIN, sample: int = 0) -> Trajectory:
    messages = [
        {"role": "system", "content": "Play.", "loss": False},
        {"role": "user", "content": "You see a coin.", "loss": False},
        {"role": "assistant", "content": "Action: take coin", "loss": True},
        {"role": "user", "content": "Taken. You won.", "loss": False},
    ]
    return Trajectory(
        env="textworld", task_id=task, policy="expert", messages=messages, sample=sample,
        rewards=[1.0], actions=["take coin"], score=1.0, success=True, turns=1, end_reason="terminated",
    )  # fmt: skip


def test_writer_appends_and_reader_skips_a_torn_last_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "t.jsonl"
    with TrajectoryWriter(path) as writer:
        writer.write(sample_trajectory(sample=0))
        writer.write(sample_trajectory(sample=1))
    with open(path, "a") as handle:  # a crash in the middle of the third write
        handle.write(json.dumps(sample_trajectory(sample=2).to_dict())[:40])
    with caplog.at_level(logging.WARNING):
        assert [t.sample for t in read_trajectories(path)] == [0, 1]
    assert "torn last line" in caplog.text
    with TrajectoryWriter(path) as writer:  # reopening cuts the torn tail before appending
        writer.write(sample_trajectory(sample=3))
    assert [t.sample for t in read_trajectories(path)] == [0, 1, 3]
    assert read_trajectories(path)[0] == sample_trajectory(sample=0)


def test_reader_refuses_corruption_before_the_last_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"a": 1}\nnot json\n{"a": 2}\n')
    with pytest.raises(ValueError, match=":2: not a JSON record"):
        list(read_jsonl(path))


def test_agentgym_conversations_round_trip() -> None:
    trajectory = sample_trajectory()
    item = to_agentgym(trajectory)
    assert item["item_id"] == f"textworld_{COIN}"
    assert [(c["from"], c["loss"]) for c in item["conversations"]] == [
        ("human", None), ("gpt", False), ("human", None), ("gpt", True), ("human", None),
    ]  # fmt: skip
    assert item["conversations"][1]["value"] == AGENTGYM_ACK
    back = from_agentgym(item, policy="expert")
    assert back.messages == trajectory.messages and (back.env, back.task_id) == ("textworld", COIN)
    # And from AgentGym's side: a record with its own acknowledgement survives both ways.
    agentgym_item = {
        "item_id": "webshop_12",
        "conversations": [
            {"from": "human", "loss": None, "value": "You are web shopping."},
            {"from": "gpt", "loss": False, "value": "OK."},
            {"from": "human", "loss": None, "value": "Find a red shirt."},
            {"from": "gpt", "loss": True, "value": "Thought: search.\nAction: search[red shirt]"},
        ],
    }
    assert to_agentgym(from_agentgym(agentgym_item)) == agentgym_item
