"""``agentgym eval`` and ``collect``: a policy playing an env's tasks."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

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
    console,
    count_lines,
    fail,
    interrupted,
    require_env,
)
from agentgym.cli.display import episode_progress, families_table, print_critic_results, results_table
from agentgym.contract.errors import UsageError

if TYPE_CHECKING:
    from agentgym.api import PolicyChoice
    from agentgym.policies.base import Policy
    from agentgym.records.trajectory import Trajectory

SPLIT_HELP = "Task split: train, validation (or dev), test, or another the env lists (textworld: ood)."


T = TypeVar("T")
commands = typer.Typer()


def _require_policy(kind: str) -> None:
    from agentgym.policies import POLICY_KINDS

    if kind not in POLICY_KINDS:
        raise fail(f"unknown policy {kind!r}; choose one of {', '.join(POLICY_KINDS)}", EXIT_USAGE)


@contextlib.contextmanager
def _exit_codes() -> Iterator[None]:
    """The Python API's errors as the CLI's exit codes: a bad argument 2, a local server
    that fails to start 1."""
    from agentgym.api import ServerStartError

    try:
        yield
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    except ServerStartError as exc:
        raise fail(str(exc)) from None


def _run_policy_job(
    env: str,
    url: str | None,
    log_dir: Path,
    token: str | None,
    job: Callable[[str, Policy, EpisodeCallbacks], Awaitable[T]],
    choice: PolicyChoice,
) -> T:
    """:func:`agentgym.api.run_with_policy` under an episode progress bar: ``job(url,
    policy, (on_plan, on_episode))``. Bad arguments exit with code 2, a server that fails
    to start with 1."""
    from agentgym.api import run_with_policy

    shown = episode_progress()

    async def run(server_url: str, policy: Policy) -> T:
        with shown.bar:
            return await job(server_url, policy, (shown.on_plan, shown.on_episode))

    with _exit_codes():
        return run_with_policy(env, url, log_dir, token, choice, run, on_note=console.print)


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
    from agentgym.api import PolicyChoice, eval_folder
    from agentgym.play.evaluation import (
        EXIT_INFRASTRUCTURE,
        RESULTS_FILE,
        TRAJECTORIES_FILE,
        infrastructure_failure,
    )

    require_env(env, url)
    _require_policy(policy)
    out = eval_folder(out, env, split, policy)
    given = {
        "agent_format": agent_format,
        "max_new_tokens": max_new_tokens,
        "max_turns": max_turns,
        "show_actions": show_actions,
        "action_order": action_order,
        "constrain_actions": constrain_actions,
    }
    choice = PolicyChoice(policy, model, base_url, api_key, concurrency, tool_calls)
    try:
        results = _evaluate(
            env, choice, split, n, k, out, url, token, seed, temperature, history_turns, given, critic
        )
    except KeyboardInterrupt:
        if critic is not None:  # critique rounds keep no resumable episode file
            raise
        saved = (
            f"{count_lines(out / TRAJECTORIES_FILE)} finished episodes are saved in {out / TRAJECTORIES_FILE}"
        )
        raise interrupted(saved, {"--out": str(out)}) from None
    if critic is not None:
        print_critic_results(env, split, results, out)
        return
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
    temperature: float | None,
    history_turns: int | None,
    given: dict[str, Any],
    critic: str | None,
) -> dict[str, Any]:
    """:func:`agentgym.api.evaluate` under an episode progress bar; exit 2 on bad arguments,
    1 when the local server does not start."""
    from agentgym.api import evaluate

    shown = episode_progress()
    with _exit_codes(), shown.bar:
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
            play=given,
            critic=critic,
            policy_args={
                "base_url": choice.base_url,
                "api_key": choice.api_key,
                "tool_calls": choice.tool_calls,
            },
            on_plan=shown.on_plan,
            on_episode=shown.on_episode,
            on_resume=shown.on_resume,
            on_note=console.print,
        )


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
    from agentgym.play.evaluation import DATASET_FORMATS, collect

    require_env(env)
    _require_policy(policy)
    if output_format not in DATASET_FORMATS:
        raise fail(
            f"unknown --format {output_format!r}; choose one of {', '.join(DATASET_FORMATS)}", EXIT_USAGE
        )
    from agentgym.api import PolicyChoice
    from agentgym.play.play_profile import PlayProfile

    played = PlayProfile(agent_format=agent_format, max_turns=max_turns, max_new_tokens=max_new_tokens)
    with _exit_codes():
        rollout = played.rollout(policy, concurrency=concurrency, temperature=temperature)

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
