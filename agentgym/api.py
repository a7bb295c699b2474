"""Evaluating from Python: what ``agentgym eval`` does, in a few lines.

    from agentgym.api import evaluate

    results = evaluate("textworld", model="runs/mine", n=32)  # plays as the run's evaluation did
    results = evaluate("choice", policy="openai", model="my-model", n=16,
                       policy_args={"base_url": "http://127.0.0.1:8001/v1"})
    print(results["success_rate"], results["out_dir"])

A local server for the env is started (on a free port) unless ``url`` is given; results go
to ``out`` as ``results.json`` and ``trajectories.jsonl``, and a second call with the same
``out`` resumes (and refuses settings that would relabel its episodes). Training from
Python is :func:`agentgym.trainers.train`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import yaml

from agentgym import registry
from agentgym.contract.errors import AgentGymError, UsageError
from agentgym.play.critic_eval import catalogue_problems, evaluate_critic, evaluate_episode_critic
from agentgym.play.evaluation import EvalConfig, build_policy, check_policy_model, check_server, env_server
from agentgym.play.evaluation import evaluate as evaluate_on
from agentgym.play.play_profile import PlayProfile, played_by
from agentgym.policies.base import Policy
from agentgym.policies.runs import RUN_CONFIG, run_of
from agentgym.records.trajectory import Trajectory

T = TypeVar("T")


def play_profile(
    model: str | Path | None,
    policy: str = "hf",
    given: Mapping[str, Any] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> PlayProfile:
    """How ``model`` is played by a policy of kind ``policy``: :class:`PlayProfile`'s
    defaults, over them how ``model``'s run played its held-out evaluations when it is a
    training run or was exported from one (fitted to ``policy``), over that the ``given``
    settings that are not None. ``on_note`` hears where the settings came from."""
    note = on_note or (lambda _: None)
    try:
        recorded = recorded_play(model)
    except (OSError, ValueError, yaml.YAMLError) as exc:  # e.g. a run of an older version
        note(f"the run's config.yaml does not load ({exc}); playing with eval's defaults")
        recorded = None
    if recorded is None:
        return PlayProfile().overridden(given)
    fitted = recorded.for_policy(policy)
    if fitted.constrain_actions != recorded.constrain_actions:
        note(f"(policy {policy} decodes unconstrained: the commands are shown, not enforced)")
    profile = fitted.overridden(given)
    note(f"playing as the run's held-out evaluation did (settings given override): {profile.described()}")
    return profile


def recorded_play(model: str | Path | None) -> PlayProfile | None:
    """How the run or exported model ``model`` names was played in its held-out evaluations;
    None for any other model. A run from before the play record: from its config."""
    if (profile := played_by(model)) is not None or (run := run_of(model)) is None:
        return profile
    from agentgym.trainers.collector import held_out_play  # torch: only for such a run
    from agentgym.trainers.config import TrainConfig

    return held_out_play(TrainConfig.load(run / RUN_CONFIG))


def evaluate(
    env: str,
    model: str | Path | None = None,
    *,
    policy: str = "hf",
    split: str = "test",
    n: int | None = None,
    k: int = 1,
    out: str | Path | None = None,
    url: str | None = None,
    token: str | None = None,
    seed: int = 0,
    concurrency: int = 8,
    temperature: float | None = None,
    history_turns: int | None = None,
    play: dict[str, Any] | None = None,
    policy_args: dict[str, Any] | None = None,
    critic: str | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_resume: Callable[[list[Trajectory]], None] | None = None,
    on_note: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (a policy of kind ``policy``) on the first ``n`` tasks of ``env``'s
    ``split``, ``k`` samples each, and return the results (``out_dir`` among them).

    Args:
        play: ``agent_format``, ``max_new_tokens``, ``max_turns``, ``show_actions``,
            ``action_order``, ``constrain_actions``; those left out come from the model's
            training run when it is one (or was exported from one), else
            :class:`~agentgym.play.play_profile.PlayProfile`'s defaults (:func:`play_profile`).
        policy_args: ``base_url``, ``api_key``, ``tool_calls`` (``policy="openai"``).
        critic: a critic model (same kind of policy): on an env with an answer key (math),
            critique-then-refine on its problems (no server); on any other env, each episode
            critiqued and replayed with the critique (:mod:`agentgym.play.critic_eval`).
        temperature: None: greedy for ``k=1``, else 1.
        history_turns: earlier turns the prompt keeps (None: all).
        on_plan, on_episode, on_resume: progress callbacks, ``on_plan(total, already_done)``
            once, ``on_episode(trajectory)`` after each episode, ``on_resume(trajectories)``
            once with the episodes kept from an earlier run in ``out``.
        on_note: hears where the play settings came from (:func:`play_profile`).

    Raises :class:`~agentgym.play.evaluation.UsageError` for bad arguments, before any server
    starts or model loads, and :class:`ServerStartError` when the local env server fails.
    """
    if url is None:
        _require_registered(env)
    profile = play_profile(model, policy, play, on_note)
    temperature = eval_temperature(temperature, k)
    rollout = profile.rollout(
        policy, concurrency=concurrency, temperature=temperature, history_turns=history_turns
    )
    out_dir = eval_folder(out, env, split, policy)
    config = EvalConfig(env=env, out_dir=out_dir, split=split, n=n, k=k, rollout=rollout, seed=seed)
    choice = PolicyChoice(
        policy, None if model is None else str(model), concurrency=concurrency, **(policy_args or {})
    )
    if critic is not None:
        check_policy_model(policy, critic)
        judged = _CriticRun(config, choice, critic, url, token, on_plan, on_episode, on_note)
        return judged.evaluate() | {"out_dir": str(out_dir)}

    async def job(server_url: str, built: Policy) -> dict[str, Any]:
        return await evaluate_on(
            server_url,
            built,
            config,
            token=token,
            on_plan=on_plan,
            on_episode=on_episode,
            on_resume=on_resume,
        )

    found = run_with_policy(env, url, out_dir / "servers", token, choice, job, on_note)
    return found | {"out_dir": str(out_dir)}


def eval_temperature(temperature: float | None, k: int) -> float:
    """The temperature asked for; None: greedy for one sample a task, 1 for several."""
    return (0.0 if k == 1 else 1.0) if temperature is None else temperature


def eval_folder(out: str | Path | None, env: str, split: str, policy: str) -> Path:
    """``out``, or a new folder under ``runs/eval`` named for the evaluation and the time."""
    return Path(out or Path("runs/eval") / f"{env}-{split}-{policy}-{time.strftime('%Y%m%d-%H%M%S')}")


class PolicyChoice(NamedTuple):
    """Which policy plays (see :func:`agentgym.play.evaluation.build_policy`)."""

    kind: str
    model: str | None
    base_url: str | None = None
    api_key: str | None = None
    concurrency: int = 8
    tool_calls: bool = False

    def build(self, model: str | None = None) -> Policy:
        """The policy, of ``model`` instead of the choice's own when given (a critic)."""
        return build_policy(
            self.kind,
            model=model or self.model,
            base_url=self.base_url,
            api_key=self.api_key,
            concurrency=self.concurrency,
            tool_calls=self.tool_calls and model is None,
        )


def run_with_policy(
    env: str,
    url: str | None,
    log_dir: Path,
    token: str | None,
    choice: PolicyChoice,
    job: Callable[[str, Policy], Awaitable[T]],
    on_note: Callable[[str], None] | None = None,
) -> T:
    """``job(server_url, policy)`` on ``env``'s server at ``url`` (a local one, logging to
    ``log_dir``, when None) with the ``choice`` of policy, closed after. The model is checked
    before any server starts, the server before the model loads; ``UsageError`` for bad
    arguments, :class:`ServerStartError` when the local server fails. ``on_note`` hears which
    server it starts or connects to."""
    check_policy_model(choice.kind, choice.model)
    if on_note is not None:
        on_note(f"starting a local {env} server ..." if url is None else f"connecting to {url} ...")
    with contextlib.ExitStack() as stack:
        try:
            server_url = stack.enter_context(env_server(env, url, log_dir))
        except (RuntimeError, TimeoutError) as exc:
            raise ServerStartError(f"{exc} (see the logs in {log_dir}/)") from None
        asyncio.run(check_server(server_url, env, token))  # a wrong server before a model loads
        built = choice.build()

        async def run() -> T:
            try:
                return await job(server_url, built)
            finally:
                await built.close()

        return asyncio.run(run())


class _CriticRun(NamedTuple):
    """``evaluate(critic=...)``: the actor (``choice``) and a critic of the same kind."""

    config: EvalConfig
    choice: PolicyChoice
    critic: str
    url: str | None
    token: str | None
    on_plan: Callable[[int, int], None] | None
    on_episode: Callable[[Trajectory], None] | None
    on_note: Callable[[str], None] | None

    def evaluate(self) -> dict[str, Any]:
        config = self.config
        if registry.serves_problems(config.env):
            if self.url is not None:
                raise UsageError(
                    f"a critic reads the problems from the {config.env} catalogue itself: drop the env url"
                )
            if self.on_note is not None:
                self.on_note("critique rounds ...")
            return asyncio.run(self._on_problems())
        log_dir = config.out_dir / "servers"
        return run_with_policy(
            config.env, self.url, log_dir, self.token, self.choice, self._on_episodes, self.on_note
        )

    async def _on_problems(self) -> dict[str, Any]:
        """Critique-then-refine on the split's problems; no env server is involved."""
        config = self.config
        actor, judge = self.choice.build(), self.choice.build(self.critic)
        try:
            problems = catalogue_problems(config.env, config.split, config.n)
            return await evaluate_critic(
                config.env,
                actor,
                judge,
                problems,
                config.out_dir,
                k=config.k,
                sampling=config.rollout.sampling,
            )
        finally:
            await actor.close()
            await judge.close()

    async def _on_episodes(self, server_url: str, actor: Policy) -> dict[str, Any]:
        """The actor plays episodes, the critic judges each, the actor replays with it."""
        config, judge = self.config, self.choice.build(self.critic)
        try:
            return await evaluate_episode_critic(
                server_url,
                actor,
                judge,
                config.env,
                config.split,
                config.n,
                config.out_dir,
                rollout=config.rollout,
                token=self.token,
                on_plan=self.on_plan,
                on_episode=self.on_episode,
            )
        finally:
            await judge.close()


class ServerStartError(RuntimeError):
    """The local env server did not start (its log is named)."""


def _require_registered(env: str) -> None:
    try:
        registry.resolve(env)
    except AgentGymError as exc:
        raise UsageError(exc.message) from None
