"""``agentgym eval`` and ``collect``: a policy playing an env's tasks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, TypeVar

import typer
import yaml

from agentgym.cli.common import (
    EXIT_USAGE,
    ApiKeyOpt,
    BaseUrlOpt,
    ConcurrencyOpt,
    ConstrainActionsOpt,
    EnvUrlOpt,
    HistoryOpt,
    MaxNewTokensOpt,
    MaxTurnsOpt,
    ModelOpt,
    PolicyOpt,
    ShowActionsOpt,
    TasksOpt,
    TemperatureOpt,
    TokenOpt,
    ToolCallsOpt,
    check_model_loads,
    console,
    count_lines,
    fail,
    interrupted,
    require_env,
)
from agentgym.cli.display import episode_progress, families_table, print_critic_results, results_table

if TYPE_CHECKING:
    from agentgym.policies.base import Policy, SamplingParams
    from agentgym.rollout import RolloutConfig
    from agentgym.trajectory import Trajectory

SPLIT_HELP = "Task split: train, validation (or dev), test, or another the env lists (textworld: ood)."


T = TypeVar("T")
commands = typer.Typer()


def _require_policy(kind: str) -> None:
    from agentgym.policies import POLICY_KINDS

    if kind not in POLICY_KINDS:
        raise fail(f"unknown policy {kind!r}; choose one of {', '.join(POLICY_KINDS)}", EXIT_USAGE)


def _rollout_config(
    play: dict[str, Any], concurrency: int, temperature: float, history_turns: int | None = None
) -> RolloutConfig:
    from agentgym.api import rollout_config
    from agentgym.evaluation import UsageError

    try:
        return rollout_config(
            play, concurrency=concurrency, temperature=temperature, history_turns=history_turns
        )
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None


def _as_the_run_played(model: str | None, policy: str) -> dict[str, Any]:
    """``PLAY_DEFAULTS``, or, for a training run or a model exported from one, how the run's
    held-out evaluation played (its model was trained on that format and those observations)."""
    from agentgym.api import PLAY_DEFAULTS, as_policy_can_play
    from agentgym.trainers.collector import evaluation_rollout

    try:
        played = evaluation_rollout(model)
    except (OSError, ValueError, yaml.YAMLError) as exc:  # e.g. a run of an older version
        console.print(
            f"[yellow]the run's config.yaml does not load ({exc}); playing with eval's defaults[/yellow]"
        )
        return PLAY_DEFAULTS
    if played is None:
        return PLAY_DEFAULTS
    playable = as_policy_can_play(played, policy)
    settings = {key: playable[key] for key in PLAY_DEFAULTS}
    if settings["constrain_actions"] != played["constrain_actions"]:
        console.print(f"(--policy {policy} decodes unconstrained: the commands are shown, not enforced)")
    console.print(
        "playing as the run's held-out evaluation did (options given override): "
        + ", ".join(f"{name} {value}" for name, value in settings.items())
    )
    return settings


class PolicyChoice(NamedTuple):
    """The policy options of ``eval`` and ``collect`` (see ``evaluation.build_policy``)."""

    kind: str
    model: str | None
    base_url: str | None
    api_key: str | None
    concurrency: int
    tool_calls: bool = False


def _run_policy_job(
    env: str,
    url: str | None,
    log_dir: Path,
    token: str | None,
    job: Callable[[str, Policy, EpisodeCallbacks], Awaitable[T]],
    choice: PolicyChoice,
) -> T:
    """Start the env server unless ``url`` is given, build the ``choice`` of policy,
    run ``job(url, policy, (on_plan, on_episode))`` under an episode progress bar, close
    both. Bad arguments exit with code 2, a server that fails to start with 1."""
    from agentgym.evaluation import UsageError, build_policy, check_server, env_server

    check_model_loads(choice.kind, choice.model)

    async def run(server_url: str, policy: Policy) -> T:
        shown = episode_progress()
        try:
            with shown.bar:
                return await job(server_url, policy, (shown.on_plan, shown.on_episode))
        finally:
            await policy.close()

    with contextlib.ExitStack() as stack:
        with console.status(f"starting a local {env} server ..." if url is None else "connecting ..."):
            try:
                server_url = stack.enter_context(env_server(env, url, log_dir))
            except (RuntimeError, TimeoutError) as exc:
                raise fail(f"{exc} (see the logs in {log_dir}/)") from None
        try:
            asyncio.run(check_server(server_url, env, token))
            with console.status(f"loading the {choice.kind} policy ..."):
                args = _policy_args(choice, choice.model)
                policy = build_policy(choice.kind, **args, tool_calls=choice.tool_calls)
            return asyncio.run(run(server_url, policy))
        except UsageError as exc:
            raise fail(str(exc), EXIT_USAGE) from None


EpisodeCallbacks = tuple[Callable[[int, int], None], Callable[["Trajectory"], None]]
"""``(on_plan(total, done), on_episode(trajectory))``: what drives an episode progress bar."""


@commands.command("eval")
def evaluate_policy(
    env: Annotated[str, typer.Option(help="Environment to evaluate on (see `agentgym envs`).")],
    policy: PolicyOpt = "hf",
    split: Annotated[str, typer.Option(help=SPLIT_HELP)] = "test",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    tool_calls: ToolCallsOpt = False,
    n: TasksOpt = None,
    k: Annotated[int, typer.Option(min=1, help="Samples per task (Avg@k, Pass@k).")] = 1,
    max_turns: MaxTurnsOpt = None,
    concurrency: ConcurrencyOpt = 8,
    temperature: TemperatureOpt = None,
    max_new_tokens: MaxNewTokensOpt = None,
    agent_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Reply format: react, json or plain. Default: react, or the training run's "
            "(--model runs/<run>).",
        ),
    ] = None,
    history_turns: HistoryOpt = None,
    show_actions: ShowActionsOpt = None,
    action_order: Annotated[
        str | None,
        typer.Option(
            help="Order of the valid commands shown: hashed (fixed per state) or listed (the env's). "
            "Default: hashed, or the training run's (--model runs/<run>).",
        ),
    ] = None,
    constrain_actions: ConstrainActionsOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Results folder; re-running with the same one resumes (default: a new one)."),
    ] = None,
    url: EnvUrlOpt = None,
    token: TokenOpt = None,
    critic: Annotated[
        str | None,
        typer.Option(
            help="Critic model (same backend as --policy). math: critique-then-refine and "
            "critique-filtered voting; other envs: each episode is critiqued and replayed with the critique."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds env resets and sampling: a re-run plays the same.")] = 0,
    max_error_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Exit with code 3 when more than this share of episodes failed for infrastructure "
            "reasons (model or env server unreachable or failing).",
        ),
    ] = 0.1,
) -> None:
    """Evaluate a policy on a task split: success rate, score, turns, invalid replies,
    Avg@k, Pass@k, per challenge (with --critic: Acc, Acc@Refine, Acc@Dis, the deltas and
    voting accuracy). A training run given as --model plays as its held-out evaluation did
    (reply format and length, valid commands shown or constrained, turn limit), unless an
    option says otherwise. Exit code 3: too many episodes failed for infrastructure reasons."""
    from agentgym.evaluation import (
        EXIT_INFRASTRUCTURE,
        RESULTS_FILE,
        TRAJECTORIES_FILE,
        infrastructure_failure,
    )

    require_env(env, url)
    _require_policy(policy)
    from agentgym.policies import CONSTRAINING_KINDS

    if constrain_actions and policy not in CONSTRAINING_KINDS:
        kinds = " or ".join(CONSTRAINING_KINDS)
        raise fail(
            f"--constrain-actions needs --policy {kinds} (the others decode unconstrained)", EXIT_USAGE
        )
    temperature = temperature if temperature is not None else (0.0 if k == 1 else 1.0)
    out = out or Path("runs/eval") / f"{env}-{split}-{policy}-{time.strftime('%Y%m%d-%H%M%S')}"
    given = {
        "agent_format": agent_format,
        "max_new_tokens": max_new_tokens,
        "max_turns": max_turns,
        "show_actions": show_actions,
        "action_order": action_order,
        "constrain_actions": constrain_actions,
    }
    played = _as_the_run_played(model, policy)
    play = {name: played[name] if value is None else value for name, value in given.items()}
    choice = PolicyChoice(policy, model, base_url, api_key, concurrency, tool_calls)
    if critic is not None:
        from agentgym.registry import serves_problems

        rollout = _rollout_config(play, concurrency, temperature, history_turns)
        check_model_loads(policy, critic)
        if serves_problems(env):
            _evaluate_with_critic(env, split, n, k, choice, critic, rollout.sampling, out, url)
        else:
            _evaluate_episodes_with_critic(env, split, n, choice, critic, rollout, out, url, token)
        return
    try:
        results = _evaluate(env, choice, split, n, k, out, url, token, seed, temperature, history_turns, play)
    except KeyboardInterrupt:
        saved = (
            f"{count_lines(out / TRAJECTORIES_FILE)} finished episodes are saved in {out / TRAJECTORIES_FILE}"
        )
        raise interrupted(saved, {"--out": str(out)}) from None
    console.print(results_table(results))
    console.print(families_table(results))
    console.print(f"results: {out / RESULTS_FILE}\ntrajectories: {out / TRAJECTORIES_FILE}")
    if reason := infrastructure_failure(results, max_error_rate):
        raise fail(reason, EXIT_INFRASTRUCTURE)


def _evaluate(
    env: str,
    choice: PolicyChoice,
    split: str,
    n: int | None,
    k: int,
    out: Path,
    url: str | None,
    token: str | None,
    seed: int,
    temperature: float,
    history_turns: int | None,
    play: dict[str, Any],
) -> dict[str, Any]:
    """:func:`agentgym.api.evaluate` under an episode progress bar; exit 2 on bad arguments,
    1 when the local server does not start."""
    from agentgym.api import ServerStartError, evaluate
    from agentgym.evaluation import UsageError

    shown = episode_progress()
    console.print(f"starting a local {env} server ..." if url is None else f"connecting to {url} ...")
    try:
        with shown.bar:
            return evaluate(
                env,
                choice.model,
                policy=choice.kind,
                split=split,
                n=n,
                k=k,
                out=out,
                url=url,
                token=token,
                seed=seed,
                concurrency=choice.concurrency,
                temperature=temperature,
                history_turns=history_turns,
                play=play,
                policy_args={
                    "base_url": choice.base_url,
                    "api_key": choice.api_key,
                    "tool_calls": choice.tool_calls,
                },
                on_plan=shown.on_plan,
                on_episode=shown.on_episode,
                on_resume=shown.on_resume,
            )
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except ServerStartError as exc:
        raise fail(str(exc)) from None


def _evaluate_with_critic(
    env: str,
    split: str,
    n: int | None,
    k: int,
    choice: PolicyChoice,
    critic: str,
    sampling: SamplingParams,
    out: Path,
    url: str | None,
) -> None:
    """``eval --critic``: the actor (``choice``) and the critic (same backend, model
    ``critic``) play critique rounds on ``split``'s problems; no env server is involved."""
    from agentgym.critic_eval import catalogue_problems, evaluate_critic
    from agentgym.evaluation import UsageError, build_policy

    if url is not None:
        raise fail(f"--critic reads the problems from the {env} catalogue itself: drop --url", EXIT_USAGE)

    async def run() -> dict[str, Any]:
        actor = build_policy(choice.kind, **_policy_args(choice, choice.model))
        judge = build_policy(choice.kind, **_policy_args(choice, critic))
        try:
            return await evaluate_critic(
                env, actor, judge, catalogue_problems(env, split, n), out, k=k, sampling=sampling
            )
        finally:
            await actor.close()
            await judge.close()

    try:
        with console.status("critique rounds ..."):
            results = asyncio.run(run())
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    print_critic_results(env, split, results, out)


def _evaluate_episodes_with_critic(
    env: str,
    split: str,
    n: int | None,
    choice: PolicyChoice,
    critic: str,
    rollout: RolloutConfig,
    out: Path,
    url: str | None,
    token: str | None,
) -> None:
    """``eval --critic`` on an agent env: the actor plays episodes, the critic (same backend,
    model ``critic``) judges each one, the actor replays each task with the critique."""
    from agentgym.critic_eval import evaluate_episode_critic
    from agentgym.evaluation import build_policy

    async def job(server_url: str, actor: Policy, callbacks: EpisodeCallbacks) -> dict[str, Any]:
        judge = build_policy(choice.kind, **_policy_args(choice, critic))
        on_plan, on_episode = callbacks
        try:
            return await evaluate_episode_critic(
                server_url,
                actor,
                judge,
                env,
                split,
                n,
                out,
                rollout=rollout,
                token=token,
                on_plan=on_plan,
                on_episode=on_episode,
            )
        finally:
            await judge.close()

    results = _run_policy_job(env, url, out / "servers", token, job, choice)
    print_critic_results(env, split, results, out)


def _policy_args(choice: PolicyChoice, model: str | None) -> dict[str, Any]:
    return {
        "model": model,
        "base_url": choice.base_url,
        "api_key": choice.api_key,
        "concurrency": choice.concurrency,
    }


@commands.command()
def collect(
    env: Annotated[str, typer.Option(help="Environment to play (see `agentgym envs`).")],
    out: Annotated[Path, typer.Option(help="Dataset file to write (JSONL; replaced unless --resume).")],
    policy: PolicyOpt = "expert",
    split: Annotated[str, typer.Option(help=SPLIT_HELP)] = "train",
    output_format: Annotated[
        str, typer.Option("--format", help="trajectory (our records) or agentgym (AgentGym conversations).")
    ] = "trajectory",
    agent_format: Annotated[
        str, typer.Option(help="Reply format of the agent turns: react, json or plain.")
    ] = "react",
    keep_failed: Annotated[
        bool, typer.Option("--all", help="Keep failed episodes too (errored ones are never kept).")
    ] = False,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    tool_calls: ToolCallsOpt = False,
    n: TasksOpt = None,
    max_turns: MaxTurnsOpt = None,
    concurrency: ConcurrencyOpt = 8,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 0.0,
    max_new_tokens: MaxNewTokensOpt = 128,
    url: EnvUrlOpt = None,
    token: TokenOpt = None,
    resume: Annotated[
        bool, typer.Option(help="Keep --out's episodes and play only the tasks it lacks.")
    ] = False,
) -> None:
    """Play every task of a split (the expert by default) and write a trajectory dataset."""
    from agentgym.evaluation import DATASET_FORMATS, collect

    require_env(env)
    _require_policy(policy)
    if output_format not in DATASET_FORMATS:
        raise fail(
            f"unknown --format {output_format!r}; choose one of {', '.join(DATASET_FORMATS)}", EXIT_USAGE
        )
    play = {
        "agent_format": agent_format,
        "max_turns": max_turns,
        "max_new_tokens": max_new_tokens,
        "show_actions": False,
        "action_order": "hashed",
        "constrain_actions": False,
    }
    rollout = _rollout_config(play, concurrency, temperature)

    async def job(server_url: str, built: Policy, callbacks: EpisodeCallbacks) -> dict[str, int]:
        on_plan, on_episode = callbacks
        return await collect(
            server_url,
            built,
            env,
            out,
            split=split,
            n=n,
            rollout=rollout,
            output_format=output_format,
            only_success=not keep_failed,
            token=token,
            on_plan=on_plan,
            on_episode=on_episode,
            resume=resume,
        )

    try:
        counts = _run_policy_job(
            env,
            url,
            out.parent / "servers",
            token,
            job,
            PolicyChoice(policy, model, base_url, api_key, concurrency, tool_calls),
        )
    except KeyboardInterrupt:
        raise interrupted(f"{count_lines(out)} episodes are saved in {out}", {"--resume": None}) from None
    kept = f", {counts['kept']} kept from before" if counts["kept"] else ""
    console.print(
        f"wrote {counts['written']} of {counts['episodes']} episodes to {out} "
        f"({counts['errored']} errored{kept})"
    )
