"""Our rollouts, ``eval`` and ``train`` on an OpenEnv env (issue 20, item 3).

The env is a test fixture written with OpenEnv's own classes (``Environment``, ``Action``,
``Observation``, ``State``) and served by OpenEnv's own ``create_app`` on loopback; our
side reaches it only through its ``ws://`` URL (agentgym/clients/openenv_client.py).
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_trainer_recipes import train
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.clients.openenv_client import TEST_SEED_BASE, OpenEnvClient
from agentgym.contract.errors import InvalidAction, UnknownTask
from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies.expert import ExpertPolicy
from agentgym.records.trajectory import read_jsonl
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread
from conftest import run_metrics

openenv_types = pytest.importorskip("openenv.core.env_server.types")
from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.mcp_environment import MCPEnvironment  # noqa: E402
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation  # noqa: E402

HIGHEST, MAX_GUESSES = 16, 8


class Guess(openenv_types.Action):
    guess: str


class Clue(openenv_types.Observation):
    prompt: str
    expert_action: str | None = None
    """The bisection's next guess: an env that publishes its oracle can be played by
    ``--policy expert`` (the adapter passes every non-text field on in ``info``)."""


class GuessNumber(Environment):
    """Guess a number from 1 to 16 drawn with the reset's seed; reward 1 when right."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Clue:
        self._secret = random.Random(seed).randint(1, HIGHEST)
        self._low, self._high = 1, HIGHEST
        self._state = openenv_types.State(episode_id=episode_id, step_count=0)
        return self._clue(f"Guess my number, 1 to {HIGHEST}.", done=False, reward=0.0)

    def step(self, action: Guess, timeout_s: float | None = None, **kwargs: Any) -> Clue:
        self._state.step_count += 1
        guess = int(action.guess) if action.guess.strip().isdigit() else None
        if guess == self._secret:
            return self._clue("Right!", done=True, reward=1.0)
        if guess is None:
            prompt = "Say a number."
        elif guess < self._secret:
            self._low, prompt = max(self._low, guess + 1), "Higher."
        else:
            self._high, prompt = min(self._high, guess - 1), "Lower."
        return self._clue(prompt, done=self._state.step_count >= MAX_GUESSES, reward=0.0)

    @property
    def state(self) -> openenv_types.State:
        return self._state

    def get_metadata(self) -> openenv_types.EnvironmentMetadata:
        return openenv_types.EnvironmentMetadata(
            name="guess-number", description="Guess a secret number.", readme_content="Reply with a number."
        )

    def _clue(self, prompt: str, *, done: bool, reward: float) -> Clue:
        oracle = None if done else str((self._low + self._high) // 2)
        return Clue(prompt=prompt, expert_action=oracle, done=done, reward=reward)


class GuessNumberTools(MCPEnvironment):
    """:class:`GuessNumber` as an OpenEnv MCP environment: one tool, ``guess(number)``; its
    result carries the clue and the oracle (as a tool call), its observation the reward and end."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        from fastmcp import FastMCP

        self._game, self._last = GuessNumber(), None
        tools = FastMCP("guess-number-tools")

        @tools.tool
        def guess(number: str) -> dict[str, Any]:
            """Guess the secret number: v1's step fields (the tool contract of docs/mcp.md)."""
            self._last = self._as_calls(self._game.step(Guess(guess=number)))
            return {"observation": self._last.prompt, "info": {"expert_action": self._last.expert_action}}

        super().__init__(tools)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Clue:
        return self._as_calls(self._game.reset(seed, episode_id))

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
        if isinstance(action, CallToolAction) and self._last is not None:
            observation.done, observation.reward = self._last.done, self._last.reward
            self._last = None
        return observation

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Any:
        raise ValueError("this env acts through its tools")

    @property
    def state(self) -> openenv_types.State:
        return self._game.state

    def get_metadata(self) -> openenv_types.EnvironmentMetadata:
        return self._game.get_metadata()

    @staticmethod
    def _as_calls(clue: Clue) -> Clue:
        if clue.expert_action is not None:
            clue.expert_action = f"guess[{clue.expert_action}]"
        return clue


def test_an_openenv_mcp_environment_is_played_through_its_tools(tmp_path: Path) -> None:
    app_ = create_app(GuessNumberTools, CallToolAction, CallToolObservation, max_concurrent_envs=8)
    with serve_in_thread(app_) as url:
        ws_url = "ws://" + url.removeprefix("http://")

        async def scenario() -> None:
            async with OpenEnvClient(ws_url) as client:
                assert "tool call" in (await client.metadata()).action_format
                created = await client.create("test/seed-10007")
                assert created.observation == "Guess my number, 1 to 16."
                assert created.info["expert_action"] == "guess[8]"
                secret = secret_of(TEST_SEED_BASE + 7)
                wrong = await client.step(created.session_id, f"guess[{secret % HIGHEST + 1}]")
                assert wrong.observation in ("Higher.", "Lower.") and not wrong.terminated
                assert wrong.info["expert_action"].startswith("guess[")  # the result's info, in info
                with pytest.raises(InvalidAction, match="names no tool of this env; its tools: guess"):
                    await client.step(created.session_id, "sing")
                right = await client.step(created.session_id, f"guess[{secret}]")
                assert (right.observation, right.reward, right.terminated) == ("Right!", 1.0, True)
                assert right.info["success"]
                await client.delete(created.session_id)

        asyncio.run(scenario())
        args = ["eval", "--env", "guess-number", "--url", ws_url, "--policy", "expert", "--n", "5"]
        result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
        assert result.exit_code == 0, result.output
        results = json.loads((tmp_path / "results.json").read_text())
        assert (results["episodes"], results["success_rate"], results["errored"]) == (5, 1.0, 0)


def secret_of(seed: int) -> int:
    return random.Random(seed).randint(1, HIGHEST)


@pytest.fixture(scope="module")
def guess_url() -> Iterator[str]:
    """OpenEnv's own server for :class:`GuessNumber`, as a ws:// URL."""
    with serve_in_thread(create_app(GuessNumber, Guess, Clue, max_concurrent_envs=8)) as url:
        yield "ws://" + url.removeprefix("http://")


def test_the_adapter_maps_actions_observations_and_rewards(guess_url: str) -> None:
    async def scenario() -> None:
        async with OpenEnvClient(guess_url) as client:
            metadata = await client.metadata()
            assert (metadata.name, metadata.instruction) == ("guess-number", "Reply with a number.")
            assert "'guess'" in metadata.action_format  # the action's only string field, from /schema
            listed = await client.tasks("test", limit=3)
            assert [t.task_id for t in listed.tasks] == [f"test/seed-{TEST_SEED_BASE + i}" for i in range(3)]
            created = await client.create("test/seed-10007")
            assert created.observation == "Guess my number, 1 to 16."  # the only string field...
            assert created.info["expert_action"] == "8" and created.info["turn"] == 0  # ...the rest is info
            secret = secret_of(TEST_SEED_BASE + 7)  # the task's seed reached the env
            wrong = await client.step(created.session_id, str(secret % HIGHEST + 1))
            assert (wrong.reward, wrong.terminated, wrong.info["success"]) == (0.0, False, False)
            assert wrong.observation in ("Higher.", "Lower.") and wrong.info["turn"] == 1
            right = await client.step(created.session_id, str(secret))
            assert (right.observation, right.reward, right.terminated, right.truncated) == (
                "Right!",
                1.0,
                True,
                False,
            )
            assert right.info["success"] and right.info["score"] == 1.0
            await client.delete(created.session_id)
            with pytest.raises(UnknownTask):
                await client.create("test/0")

    asyncio.run(scenario())


def test_rollouts_play_an_openenv_env_and_our_own_server_over_openenv(guess_url: str) -> None:
    specs = [EpisodeSpec(f"test/seed-{TEST_SEED_BASE + i}", split="test") for i in range(4)]
    played = asyncio.run(run_episodes(guess_url, ExpertPolicy(), specs, RolloutConfig(max_turns=8)))
    assert sorted(t.task_id for t in played) == sorted(s.task_id for s in specs)
    assert all(t.success and t.end_reason == "terminated" and t.rewards[-1] == 1.0 for t in played)
    with serve_in_thread(ServerConfig(env="choice")) as url:  # AgentGym -> OpenEnv -> AgentGym
        ours = asyncio.run(run_episodes("ws" + url.removeprefix("http"), ExpertPolicy(), specs))
    assert all(t.success and t.score == 1.0 and t.env == "choice" for t in ours)


def test_agentgym_eval_scores_an_openenv_env(guess_url: str, tmp_path: Path) -> None:
    args = ["eval", "--env", "guess-number", "--url", guess_url, "--policy", "expert", "--n", "5"]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["env"], results["episodes"], results["success_rate"]) == ("guess-number", 5, 1.0)
    assert results["errored"] == 0 and 1 <= results["mean_turns"] <= 5  # bisection over 16
    wrong_name = CliRunner().invoke(
        app, ["eval", "--env", "textworld", *args[3:], "--out", str(tmp_path / "x")]
    )
    assert wrong_name.exit_code == 2 and "serves 'guess-number'" in wrong_name.output


def test_agentgym_train_runs_an_rl_step_on_an_openenv_env(
    guess_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    code, output = train(tmp_path, "grpo", tiny_model_dir, env="guess-number", env_url=guess_url)
    assert code == 0, output
    history = run_metrics(tmp_path)
    assert len(history) == 1 and history[0]["phase"] != "bc" and history[0]["episodes"] == 4
    played = list(read_jsonl(tmp_path / "rollouts" / "step-000001.jsonl"))
    assert {e["env"] for e in played} == {"guess-number"} and len(played) == 4
    assert all(e["task_id"].startswith("train/seed-") and e["turns"] >= 1 for e in played)
