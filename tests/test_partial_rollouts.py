"""Per-token policy versions and partial rollouts (pause at a token budget, resume later,
possibly under new weights) on a real textworld server, with a real (tiny) HF model."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

pytest.importorskip("textworld")
pytest.importorskip("transformers")

from agentgym.agents.tokens import encode, sampled_versions
from agentgym.clients.env_client import AsyncEnvClient
from agentgym.contract.errors import UnknownSession
from agentgym.play.rollout import Episode, EpisodeSpec, RolloutConfig, Rollouts, run_episodes
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.hf import HFPolicy
from agentgym.records.trajectory import Trajectory
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

COIN = "tw-coin_collector/level1/s1000000"
HUNT = "tw-treasure_hunter/level3/s1000005"
SIMPLE = "tw-simple/dense-detailed/s1000002"
"""Eight expert steps."""


@pytest.fixture(scope="module")
def server(agentgym_cache: str) -> Iterator[str]:
    """A server of this module's own, so session counts are exact."""
    with serve_in_thread(ServerConfig(env="textworld", max_sessions=32)) as url:
        yield url


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Iterator[HFPolicy]:
    policy = HFPolicy(str(tiny_model_dir), device="cpu", name="tiny")
    yield policy
    asyncio.run(policy.close())


class TokenExpert:
    """A token-level policy replying with the expert action (canonical ids + end-of-turn),
    each token stamped with ``version``: it steps the env, so rewards and score move."""

    def __init__(self, tokenizer: Any) -> None:
        self.name, self.tokenizer, self.version = "token-expert", tokenizer, 0

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        out = []
        for request in requests:
            text = request.info["expert_action"]
            ids = [*encode(self.tokenizer, text), self.tokenizer.convert_tokens_to_ids("<|im_end|>")]
            out.append(Generation(text, ids, [-0.25] * len(ids), "stop", versions=[self.version] * len(ids)))
        return out

    async def close(self) -> None:
        pass


def sessions_created(url: str) -> int:
    text = httpx.get(f"{url}/metrics").text
    return int(float(re.search(r"^agentgym_sessions_created\{[^}]*\} (\S+)$", text, re.M).group(1)))


def sessions_active(url: str) -> int:
    return httpx.get(f"{url}/health").json()["sessions"]


def perturbed(policy: HFPolicy, seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        k: v + 0.5 * torch.randn(v.shape, generator=generator, dtype=v.dtype) if v.is_floating_point() else v
        for k, v in policy.model.state_dict().items()
    }


SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=6, seed=11)


def test_every_sampled_token_records_the_weights_version(server: str, tiny: HFPolicy) -> None:
    tiny.weights_version = 3
    specs = [EpisodeSpec(COIN, 0), EpisodeSpec(HUNT, 0)]
    config = RolloutConfig(max_turns=2, sampling=SAMPLING, seed=1)
    trajectories = asyncio.run(run_episodes(server, tiny, specs, config))
    assert len(trajectories) == 2
    for trajectory in trajectories:
        assert trajectory.turns == 2 and trajectory.end_reason == "truncated"
        assert len(trajectory.versions) == len(trajectory.token_ids) == len(trajectory.loss_mask)
        for version, mask in zip(trajectory.versions, trajectory.loss_mask, strict=True):
            assert version == (3 if mask else -1)
        assert sum(trajectory.loss_mask) == trajectory.generated_tokens > 0
    # The record round-trips, and older records without versions still load.
    record = trajectories[0].to_dict()
    assert Trajectory.from_dict(record).versions == trajectories[0].versions
    del record["versions"]
    assert Trajectory.from_dict(record).versions is None


def test_generation_versions_follow_update_weights(tiny: HFPolicy) -> None:
    original = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    request = GenerationRequest([], prompt_ids=tiny.prompt_ids([{"role": "user", "content": "hi"}]))
    try:
        tiny.update_weights(original, version=41)
        assert tiny.weights_version == 41
        (first,) = asyncio.run(tiny.generate([request], SAMPLING))
        tiny.update_weights(original)
        assert tiny.weights_version == 42
        (second,) = asyncio.run(tiny.generate([request], SAMPLING))
    finally:
        tiny.update_weights(original, version=0)
    assert first.versions == [41] * len(first.token_ids) and len(first.token_ids) > 0
    assert second.versions == [42] * len(second.token_ids)
    # Same weights, same seed: the version is the only difference.
    assert (first.token_ids, first.logprobs) == (second.token_ids, second.logprobs)


def test_paused_episodes_resume_under_new_weights_keeping_their_past(server: str, tiny: HFPolicy) -> None:
    original = {k: v.clone() for k, v in tiny.model.state_dict().items()}
    tiny.update_weights(original, version=2)
    specs = [EpisodeSpec(COIN, 0), EpisodeSpec(SIMPLE, 0), EpisodeSpec(HUNT, 1)]
    config = RolloutConfig(max_turns=4, sampling=SAMPLING, seed=5)
    created_before = sessions_created(server)

    async def scenario() -> tuple[list[Trajectory], list[Trajectory], dict[str, Any], list[Episode]]:
        async with Rollouts(server, tiny, config) as rollouts:
            # 6 tokens per turn at most: a budget of 6 pauses every episode after its first turn.
            first = await rollouts.play(specs, token_budget=6)
            paused = rollouts.paused
            assert len(paused) == 3 and all(e.paused for e in paused)
            assert sessions_active(server) == 3
            past = {
                e.spec.task_id: {
                    "ids": list(e.tokens.ids),
                    "logprobs": list(e.tokens.logprobs),
                    "versions": list(e.tokens.versions),
                    "rewards": list(e.rewards),
                    "turns": len(e.actions),
                    "session": e.session_id,
                    "generation_time": e.timings["generation"],
                }
                for e in paused
            }
            assert all(e.oldest_version == 2 for e in paused)
            tiny.update_weights(perturbed(tiny, seed=1), version=7)
            second = await rollouts.play([])
            assert rollouts.paused == [] and not any(e.paused for e in paused)
            return first, second, past, paused

    try:
        first, second, past, paused = asyncio.run(scenario())
    finally:
        tiny.update_weights(original, version=0)
    assert first == []
    assert sorted(t.task_id for t in second) == sorted(s.task_id for s in specs)
    assert sessions_created(server) == created_before + 3  # resuming opened no new session
    assert sessions_active(server) == 0  # and every session was deleted at the end
    for trajectory in second:
        before = past[trajectory.task_id]
        n = len(before["ids"])
        assert trajectory.turns == 4 == len(trajectory.rewards)  # one turn before the pause, three after
        assert before["turns"] == 1 and trajectory.rewards[:1] == before["rewards"]
        assert trajectory.token_ids[:n] == before["ids"]
        assert trajectory.logprobs[:n] == before["logprobs"]
        assert trajectory.versions[:n] == before["versions"]
        assert set(
            sampled_versions(trajectory.versions, trajectory.loss_mask)[: sum(trajectory.loss_mask[:n])]
        ) == {2}
        resumed = [v for v, m in zip(trajectory.versions[n:], trajectory.loss_mask[n:], strict=True) if m]
        assert resumed and set(resumed) == {7}
        assert len(trajectory.versions) == len(trajectory.token_ids)
        assert trajectory.timings["generation"] > before["generation_time"]
    assert {e.session_id for e in paused} == {p["session"] for p in past.values()}


def test_budget_counts_per_call_and_state_adds_up(server: str, tiny: HFPolicy) -> None:
    """A token-level expert on an eight-step task, one turn per call: every call resumes
    the same session and the rewards, actions and score add up to the full episode."""
    policy = TokenExpert(tiny.tokenizer)
    config = RolloutConfig(seed=0)

    async def scenario() -> tuple[list[list[Trajectory]], list[tuple[str | None, int]]]:
        calls: list[list[Trajectory]] = []
        states: list[tuple[str | None, int]] = []
        async with Rollouts(server, policy, config) as rollouts:
            calls.append(await rollouts.play([EpisodeSpec(SIMPLE)], token_budget=1))
            while rollouts.paused:
                (episode,) = rollouts.paused
                states.append((episode.session_id, len(episode.actions)))
                policy.version += 1
                calls.append(await rollouts.play([], token_budget=1))
        return calls, states

    created_before = sessions_created(server)
    calls, states = asyncio.run(scenario())
    assert sessions_created(server) == created_before + 1
    *pauses, last = calls
    assert all(done == [] for done in pauses) and len(last) == 1
    (trajectory,) = last
    assert trajectory.end_reason == "terminated" and trajectory.success and trajectory.score == 1.0
    assert trajectory.turns == len(trajectory.actions) == len(calls) == 8
    assert [turns for _, turns in states] == list(range(1, 8))
    assert len({session for session, _ in states}) == 1
    assert sum(trajectory.rewards) > 0 and None not in trajectory.actions
    # One turn per call, and each call's policy version on that turn's tokens.
    segments: list[int] = []
    for version, mask in zip(trajectory.versions, trajectory.loss_mask, strict=True):
        if mask and (not segments or segments[-1] != version):
            segments.append(version)
    assert segments == list(range(8))


def test_drop_deletes_the_paused_sessions(server: str, tiny: HFPolicy) -> None:
    config = RolloutConfig(max_turns=3, sampling=SAMPLING)

    async def scenario() -> None:
        async with Rollouts(server, tiny, config) as rollouts:
            await rollouts.play([EpisodeSpec(COIN, 0), EpisodeSpec(HUNT, 0)], token_budget=1)
            first, second = rollouts.paused
            assert sessions_active(server) == 2
            async with AsyncEnvClient(server) as client:
                await client.state(first.session_id)  # alive while paused
                await rollouts.drop([first])
                assert rollouts.paused == [second]
                with pytest.raises(UnknownSession):
                    await client.step(first.session_id, "look")
                await client.state(second.session_id)
            with pytest.raises(ValueError, match="not paused here"):
                await rollouts.drop([first])
            with pytest.raises(RuntimeError, match="already ended"):
                await first.run()
        # Leaving the block deletes the sessions still paused.
        assert sessions_active(server) == 0
        async with AsyncEnvClient(server) as client:
            with pytest.raises(UnknownSession):
                await client.state(second.session_id)

    asyncio.run(scenario())


def test_a_budget_never_reached_does_not_pause(server: str, tiny: HFPolicy) -> None:
    specs = [EpisodeSpec(COIN, 0), EpisodeSpec(HUNT, 0)]
    config = RolloutConfig(max_turns=2, sampling=SAMPLING, seed=3)
    plain = asyncio.run(run_episodes(server, tiny, specs, config))

    async def with_budget() -> tuple[list[Trajectory], list[Episode]]:
        async with Rollouts(server, tiny, config) as rollouts:
            return await rollouts.play(specs, token_budget=10_000), rollouts.paused

    budgeted, paused = asyncio.run(with_budget())
    assert paused == [] and len(budgeted) == 2
    by_task = {t.task_id: t for t in plain}
    for trajectory in budgeted:
        same = by_task[trajectory.task_id]
        assert trajectory.turns == same.turns == 2 and trajectory.end_reason == "truncated"
        assert (trajectory.token_ids, trajectory.versions) == (same.token_ids, same.versions)
        assert trajectory.logprobs == pytest.approx(same.logprobs, abs=1e-5)  # batch neighbours differ
    assert sessions_active(server) == 0


def test_invalid_budget_and_closed_rollouts_are_refused(server: str, tiny: HFPolicy) -> None:
    async def scenario() -> None:
        rollouts = Rollouts(server, tiny)
        with pytest.raises(RuntimeError, match="not open"):
            await rollouts.play([EpisodeSpec(COIN)])
        async with rollouts:
            with pytest.raises(ValueError, match="token_budget"):
                await rollouts.play([EpisodeSpec(COIN)], token_budget=0)

    asyncio.run(scenario())
