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
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym import registry
from agentgym.agents import ACTION_ORDERS, FORMATS
from agentgym.errors import AgentGymError
from agentgym.evaluation import (
    EvalConfig,
    UsageError,
    build_policy,
    check_policy_model,
    check_server,
    env_server,
)
from agentgym.evaluation import evaluate as evaluate_on
from agentgym.policies import CONSTRAINING_KINDS
from agentgym.policies.base import SamplingParams
from agentgym.policies.runs import played_by
from agentgym.rollout import RolloutConfig
from agentgym.trajectory import Trajectory

PLAY_DEFAULTS: dict[str, Any] = {
    "agent_format": "react",
    "max_new_tokens": 128,
    "max_turns": None,
    "show_actions": False,
    "action_order": "hashed",
    "constrain_actions": False,
}
"""How a model that is not a training run plays, where nothing says otherwise (``max_turns``
None: the env's limit)."""


def play_settings(
    model: str | Path | None, given: dict[str, Any] | None = None, policy: str = "hf"
) -> dict[str, Any]:
    """:data:`PLAY_DEFAULTS`, over them how ``model``'s run played (if it is one; fitted to
    ``policy`` by :func:`as_policy_can_play`), over that the ``given`` settings that are not
    None (the run's record is not read when they are all given, as the CLI gives them)."""
    given = {key: value for key, value in (given or {}).items() if value is not None}
    unknown = set(given) - set(PLAY_DEFAULTS)
    if unknown:
        raise UsageError(
            f"unknown play settings {', '.join(sorted(unknown))}; they are {', '.join(PLAY_DEFAULTS)}"
        )
    played = {} if set(given) >= set(PLAY_DEFAULTS) else as_policy_can_play(played_by(model) or {}, policy)
    return PLAY_DEFAULTS | {key: played[key] for key in PLAY_DEFAULTS if key in played} | given


def as_policy_can_play(played: dict[str, Any], policy: str) -> dict[str, Any]:
    """A run's play record for a policy of kind ``policy``: one that cannot constrain its
    replies (an OpenAI-compatible server decodes freely) is shown the valid commands the run
    was constrained to, and picks among them by itself (a trained model ends its reply)."""
    if played.get("constrain_actions") and policy not in CONSTRAINING_KINDS:
        return played | {"constrain_actions": False, "show_actions": True}
    return played


def rollout_config(
    play: dict[str, Any], *, concurrency: int, temperature: float, history_turns: int | None = None
) -> RolloutConfig:
    """The rollout of a full set of play settings; ``UsageError`` for an unknown format."""
    if play["agent_format"] not in FORMATS:
        raise UsageError(f"unknown agent format {play['agent_format']!r}; formats are {', '.join(FORMATS)}")
    if play["action_order"] not in ACTION_ORDERS:
        raise UsageError(
            f"unknown action order {play['action_order']!r}; orders are {', '.join(ACTION_ORDERS)}"
        )
    return RolloutConfig(
        max_turns=play["max_turns"],
        concurrency=concurrency,
        sampling=SamplingParams(temperature=temperature, max_new_tokens=play["max_new_tokens"]),
        format=play["agent_format"],
        history_turns=history_turns,
        show_actions=play["show_actions"] or play["constrain_actions"],
        action_order=play["action_order"],
        constrain_actions=play["constrain_actions"],
    )


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
    on_plan: Callable[[int, int], None] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_resume: Callable[[list[Trajectory]], None] | None = None,
) -> dict[str, Any]:
    """Evaluate ``model`` (a policy of kind ``policy``) on the first ``n`` tasks of ``env``'s
    ``split``, ``k`` samples each, and return the results (``out_dir`` among them).

    Args:
        play: ``agent_format``, ``max_new_tokens``, ``max_turns``, ``show_actions``,
            ``action_order``, ``constrain_actions``; those left out come from the model's training run when it
            is one (or was exported from one), else :data:`PLAY_DEFAULTS`.
        policy_args: ``base_url``, ``api_key``, ``tool_calls`` (``policy="openai"``).
        temperature: None: greedy for ``k=1``, else 1.
        history_turns: earlier turns the prompt keeps (None: all).
        on_plan, on_episode, on_resume: progress callbacks, ``on_plan(total, already_done)``
            once, ``on_episode(trajectory)`` after each episode, ``on_resume(trajectories)``
            once with the episodes kept from an earlier run in ``out``.

    Raises :class:`~agentgym.evaluation.UsageError` for bad arguments, before any server
    starts or model loads, and :class:`ServerStartError` when the local env server fails.
    """
    if url is None:
        _require_registered(env)
    settings = play_settings(model, play, policy)
    if settings["constrain_actions"] and policy not in CONSTRAINING_KINDS:
        raise UsageError(
            f"constrain_actions needs policy {' or '.join(CONSTRAINING_KINDS)} (the others decode unconstrained)"
        )
    temperature = (0.0 if k == 1 else 1.0) if temperature is None else temperature
    rollout = rollout_config(
        settings, concurrency=concurrency, temperature=temperature, history_turns=history_turns
    )
    out_dir = Path(out or Path("runs/eval") / f"{env}-{split}-{policy}-{time.strftime('%Y%m%d-%H%M%S')}")
    config = EvalConfig(env=env, out_dir=out_dir, split=split, n=n, k=k, rollout=rollout, seed=seed)
    spec = None if model is None else str(model)
    check_policy_model(policy, spec)
    with contextlib.ExitStack() as stack:
        try:
            server_url = stack.enter_context(env_server(env, url, out_dir / "servers"))
        except (RuntimeError, TimeoutError) as exc:
            raise ServerStartError(f"{exc} (see the logs in {out_dir / 'servers'}/)") from None
        asyncio.run(check_server(server_url, env, token))  # a wrong server before a model loads
        args = {"base_url": None, "api_key": None} | (policy_args or {})
        built = build_policy(policy, model=spec, concurrency=concurrency, **args)

        async def run() -> dict[str, Any]:
            try:
                return await evaluate_on(
                    server_url,
                    built,
                    config,
                    token=token,
                    on_plan=on_plan,
                    on_episode=on_episode,
                    on_resume=on_resume,
                )
            finally:
                await built.close()

        results = asyncio.run(run())
    return results | {"out_dir": str(out_dir)}


class ServerStartError(RuntimeError):
    """The local env server did not start (its log is named)."""


def _require_registered(env: str) -> None:
    try:
        registry.resolve(env)
    except AgentGymError as exc:
        raise UsageError(exc.message) from None
