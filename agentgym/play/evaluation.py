"""Evaluation: play k samples of every task of a split, store the trajectories, report
success rate, mean score and turns, Avg@k, Pass@k and throughput.

The run is resumable: trajectories are appended to ``<out>/trajectories.jsonl`` as each
episode ends, and a later run with the same ``out`` skips every ``(task_id, sample)``
pair that already has a finished (non-error) record there, counting it in the results.
Errored episodes are played again on resume, and the latest record of a pair wins.

Errored episodes count as failures in ``success_rate`` and are reported separately
(``errored``, ``error_kinds``, ``success_rate_excluding_errors``), so an env outage
shows up instead of silently shrinking the denominator. An episode errs only for
infrastructure reasons (the model or the env server failed or could not be reached): a
reply that does not parse is a spent turn, counted in ``invalid_reply_rate``.
``results.json`` also records what ran: the model (spec, folder and a sha256 of its
files), the seed, the settings and the git commit of this code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import math
import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agentgym.clients.env_client import RetryPolicy
from agentgym.clients.openenv_client import env_client
from agentgym.contract.errors import AgentGymError, UsageError
from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies import POLICY_KINDS, Policy, make_policy
from agentgym.records.run_folder import read_json_object
from agentgym.records.trajectory import Trajectory, TrajectoryWriter, read_jsonl, read_trajectories
from agentgym.wire import Metadata

log = logging.getLogger(__name__)

TRAJECTORIES_FILE = "trajectories.jsonl"
RESULTS_FILE = "results.json"
SETTINGS_FILE = "settings.json"
"""What an evaluation folder's episodes were played with, written before the first episode."""
RESUMABLE = frozenset({"n", "k", "concurrency"})
"""Settings a resumed evaluation may change: they add tasks or samples, or pace the same plan."""


@dataclass
class EvalConfig:
    """One evaluation run."""

    env: str
    """Registered environment name; the server at the URL must serve it."""
    out_dir: Path
    """Where ``trajectories.jsonl`` and ``results.json`` go (and are resumed from)."""
    split: str = "test"
    n: int | None = None
    """Evaluate the first ``n`` tasks of the split (``None``: all)."""
    k: int = 1
    """Samples per task (Avg@k, Pass@k)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    seed: int = 0
    """Seeds every env reset and every generation (varied per task, sample and turn), so a
    re-run with the same seed plays the same episodes."""

    def seeded_rollout(self) -> RolloutConfig:
        sampling = dataclasses.replace(self.rollout.sampling, seed=self.seed)
        return dataclasses.replace(self.rollout, seed=self.seed, sampling=sampling)

    def describe(self) -> dict[str, Any]:
        """The settings that shape the results, for ``results.json``."""
        rollout = self.rollout
        return {
            "split": self.split,
            "n": self.n,
            "k": self.k,
            "seed": self.seed,
            "max_turns": rollout.max_turns,
            "format": rollout.format,
            "temperature": rollout.sampling.temperature,
            "top_p": rollout.sampling.top_p,
            "max_new_tokens": rollout.sampling.max_new_tokens,
            "history_turns": rollout.history_turns,
            "show_actions": rollout.show_actions,
            "action_order": rollout.action_order,
            "constrain_actions": rollout.constrain_actions,
            "concurrency": rollout.concurrency,
        }


MAX_ERROR_RATE = 0.1
"""``agentgym eval`` exits with :data:`EXIT_INFRASTRUCTURE` when more than this share of the
episodes errored (the model or the env server failed or was unreachable)."""
EXIT_INFRASTRUCTURE = 3


# ----- environment servers and policies -------------------------------------------------


async def check_server(url: str, env: str, token: str | None = None) -> Metadata:
    """The server's metadata; ``UsageError`` when it is unreachable, not an env server, or
    serves another environment."""
    try:
        async with env_client(url, token=token, timeout=10.0, retry=RetryPolicy(attempts=2)) as client:
            metadata = await client.metadata()
    except (httpx.HTTPError, AgentGymError, ValueError) as exc:
        raise UsageError(f"no AgentGym env server answers at {url} ({type(exc).__name__}: {exc})") from None
    if metadata.name != env:
        raise UsageError(f"the server at {url} serves {metadata.name!r}, not {env!r}")
    return metadata


@contextlib.contextmanager
def env_server(env: str, url: str | None, log_dir: Path, timeout: float = 180.0) -> Iterator[str]:
    """``url`` as given, or a local server for ``env`` on a free port (so it never takes the
    port ``agentgym up`` would use), logging to ``log_dir``, stopped on exit."""
    if url is not None:
        yield url
        return
    from agentgym.servers.launcher import serve_processes

    log_dir.mkdir(parents=True, exist_ok=True)
    with serve_processes([env], log_dir=str(log_dir), timeout=timeout) as servers:
        yield servers[0].url


def check_policy_model(kind: str, model: str | None) -> None:
    """``UsageError`` within seconds when the model of an ``hf`` or ``vllm`` policy cannot
    load here (:func:`~agentgym.policies.models.check_model`), or a model is given to the
    expert, which plays no model: before any server starts."""
    if kind == "expert" and model is not None:
        raise UsageError(f"--policy expert plays the env's expert and no model: drop --model {model}")
    if kind not in ("hf", "vllm"):
        return
    from agentgym.policies.models import DEFAULT_MODEL, ModelNotAvailable, check_model

    try:
        check_model(model or DEFAULT_MODEL)
    except ModelNotAvailable as exc:
        raise UsageError(str(exc)) from None


def build_policy(
    kind: str,
    *,
    model: str | None,
    base_url: str | None,
    api_key: str | None,
    concurrency: int,
    tool_calls: bool = False,
) -> Policy:
    """The policy ``kind`` from CLI-style arguments; ``UsageError`` for bad combinations."""
    if kind not in POLICY_KINDS:
        raise UsageError(f"unknown policy {kind!r}; choose one of {', '.join(POLICY_KINDS)}")
    if tool_calls and kind != "openai":
        raise UsageError("--tool-calls needs --policy openai (an OpenAI-compatible endpoint)")
    kwargs: dict[str, Any] = {}
    if kind == "openai":
        if not base_url or not model:
            raise UsageError("--policy openai needs --base-url and --model")
        kwargs = {"base_url": base_url, "model": model, "api_key": api_key, "concurrency": concurrency}
        kwargs["tool_calls"] = tool_calls
    elif kind in ("hf", "vllm"):
        kwargs = {"model": model} if model else {}
        if kind == "hf":
            # Every episode in flight may wait for a reply at once: let them share one batch.
            kwargs["max_batch_size"] = concurrency
    try:
        return make_policy(kind, **kwargs)
    except (ImportError, RuntimeError, OSError, ValueError) as exc:
        raise UsageError(f"cannot build the {kind} policy: {exc}") from None


# ----- planning and resuming ------------------------------------------------------------


def claim_folder(out_dir: Path, settings: dict[str, Any]) -> None:
    """Record ``settings`` in ``out_dir`` before any episode runs; ``UsageError`` when the
    folder already holds episodes played otherwise (another model, by its weights' hash,
    turn limit, seed, ...): resuming them would report them under the new settings. A folder from
    before this record, with episodes, is judged by its ``results.json``."""
    saved_path = out_dir / SETTINGS_FILE
    saved = read_json_object(saved_path) or (read_json_object(out_dir / RESULTS_FILE) or {}).get("config")
    if saved and (out_dir / TRAJECTORIES_FILE).exists():
        changed = [
            f"{key} {saved.get(key)!r} -> {value!r}"
            for key, value in settings.items()
            if key not in RESUMABLE and key in saved and saved[key] != value
        ]
        if changed:
            raise UsageError(
                f"{out_dir} holds an evaluation played with other settings ({'; '.join(changed)}): "
                "resuming would report its episodes under the new ones. Pick another --out, or "
                "delete that folder to start over"
            )
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(saved_path, settings)


async def list_tasks(url: str, split: str, n: int | None, token: str | None = None) -> list[str]:
    """Task ids of ``split`` in order, the first ``n`` of them when ``n`` is set."""
    ids: list[str] = []
    async with env_client(url, token=token) as client:
        try:
            while n is None or len(ids) < n:
                page = await client.tasks(split, offset=len(ids), limit=1000)
                ids += [task.task_id for task in page.tasks]
                if not page.tasks or len(ids) >= page.total:
                    break
        except AgentGymError as exc:
            raise UsageError(exc.message) from None
    return ids[:n] if n is not None else ids


def collected_tasks(path: Path, env: str) -> set[str]:
    """The task ids of ``env`` a dataset file holds, in either format."""
    prefix = f"{env}_"
    tasks = set()
    for record in read_jsonl(path):
        if "item_id" in record and record["item_id"].startswith(prefix):  # AgentGym's conversations
            tasks.add(record["item_id"].removeprefix(prefix))
        elif record.get("env") == env:
            tasks.add(record["task_id"])
    return tasks


def plan_episodes(task_ids: list[str], k: int, split: str) -> list[EpisodeSpec]:
    """Sample-major order: every task's first sample before any task's second, so a run cut
    short still covers every task."""
    return [EpisodeSpec(task_id, sample, split) for sample in range(k) for task_id in task_ids]


def load_previous(path: Path, env: str) -> dict[tuple[str, int], Trajectory]:
    """The latest record per ``(task_id, sample)`` of ``env`` in ``path`` (empty if none)."""
    if not path.exists():
        return {}
    return {t.key: t for t in read_trajectories(path) if t.env == env}


# ----- metrics --------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased Pass@k from ``n`` samples of which ``c`` succeeded (Chen et al., 2021):
    ``1 - C(n-c, k) / C(n, k)``."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def summarize(trajectories: list[Trajectory], k: int, ran: list[Trajectory], wall_s: float) -> dict[str, Any]:
    """The results of a run: quality over ``trajectories`` (one per planned episode,
    resumed ones included), throughput over ``ran`` (the episodes played this time)."""
    valid = [t for t in trajectories if not t.errored]
    by_task: dict[str, list[bool]] = {}
    for t in trajectories:
        by_task.setdefault(t.task_id, []).append(t.success)
    tokens = [t.generated_tokens for t in ran if t.generated_tokens is not None]
    return {
        **outcome_figures(trajectories),
        "tasks": len(by_task),
        "k": k,
        "success_rate_excluding_errors": sum(t.success for t in valid) / len(valid) if valid else None,
        "avg_at_k": _mean(sum(s) / len(s) for s in by_task.values()),
        "pass_at_k": {str(j): _mean(pass_at_k(len(s), sum(s), j) for s in by_task.values()) for j in _ks(k)},
        "error_kinds": dict(Counter(t.end_reason for t in trajectories if t.errored)),
        "end_reasons": dict(Counter(t.end_reason for t in trajectories)),
        "template_drift": sum(t.template_drift for t in trajectories),
        "ran": len(ran),
        "resumed": len(trajectories) - len(ran),
        "wall_s": round(wall_s, 3),
        "episodes_per_min": len(ran) / wall_s * 60 if wall_s > 0 else None,
        "generated_tokens_per_s": sum(tokens) / wall_s if tokens and wall_s > 0 else None,
        "by_family": {
            name: outcome_figures(group) for name, group in sorted(_families(trajectories).items())
        },
    }


def outcome_figures(trajectories: list[Trajectory]) -> dict[str, Any]:
    """Success, score, turns, invalid replies and errors of a set of episodes."""
    count = max(len(trajectories), 1)
    turns = sum(t.turns for t in trajectories)
    # A turn whose reply did not parse sends no action (``None``): the env never saw it.
    invalid = sum(a is None for t in trajectories for a in t.actions)
    # The rest of the invalid turns parsed, but the env refused the action or did not list it.
    rejected = sum(t.invalid_turns for t in trajectories) - invalid
    return {
        "episodes": len(trajectories),
        "success_rate": sum(t.success for t in trajectories) / count,
        "mean_score": sum(t.score for t in trajectories) / count,
        "mean_turns": turns / count,
        "invalid_reply_rate": invalid / turns if turns else None,
        "rejected_action_rate": rejected / turns if turns else None,
        "errored": sum(t.errored for t in trajectories),
    }


def task_family(task_id: str) -> str:
    """The challenge a task belongs to: its id up to the first ``/`` (``tw-cooking``)."""
    return task_id.partition("/")[0]


def _families(trajectories: list[Trajectory]) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = {}
    for trajectory in trajectories:
        groups.setdefault(task_family(trajectory.task_id), []).append(trajectory)
    return groups


def infrastructure_failure(results: dict[str, Any], max_error_rate: float = MAX_ERROR_RATE) -> str | None:
    """Why the run failed for infrastructure reasons (more than ``max_error_rate`` of its
    episodes errored), or None."""
    episodes, errored = results["episodes"], results["errored"]
    if not episodes or errored / episodes <= max_error_rate:
        return None
    kinds = ", ".join(f"{kind} x{n}" for kind, n in results["error_kinds"].items())
    return (
        f"{errored} of {episodes} episodes failed for infrastructure reasons ({kinds}), "
        f"more than the {max_error_rate:.0%} allowed (--max-error-rate); see the error field "
        "of the records in trajectories.jsonl"
    )


def source_revision() -> dict[str, Any]:
    """The git commit of this code and whether the work tree differs from it (None outside git)."""
    root = Path(__file__).resolve().parents[2]  # the checkout (agentgym/play/ is two down)

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": bool(changes) if changes is not None else None}


def describe_model(policy: Policy) -> dict[str, Any]:
    """What ``results.json`` records of the model: spec, folder and sha256 for local models
    (:meth:`~agentgym.policies.models.ModelSource.describe`), the name for the others."""
    source = getattr(policy, "source", None)
    return source.describe() if source is not None else {"spec": policy.name}


def _ks(k: int) -> list[int]:
    """Pass@j for j = 1, 2, 4, ... and k itself."""
    return sorted({k, *(2**i for i in range(k.bit_length()) if 2**i <= k)})


def _mean(values: Iterable[float]) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


# ----- the run --------------------------------------------------------------------------


async def evaluate(
    url: str,
    policy: Policy,
    config: EvalConfig,
    *,
    token: str | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    on_resume: Callable[[list[Trajectory]], None] | None = None,
) -> dict[str, Any]:
    """Run (or resume) the evaluation and return the results, also written to
    ``<out>/results.json``. ``on_resume(kept)`` is called once with the episodes an earlier
    run finished (when there are any), then ``on_plan(total, already_done)`` once before the
    first episode, ``on_episode`` after each."""
    metadata = await check_server(url, config.env, token)
    task_ids = await list_tasks(url, config.split, config.n, token)
    if not task_ids:
        raise UsageError(f"split {config.split!r} of {config.env!r} has no tasks")
    plan = plan_episodes(task_ids, config.k, config.split)
    model = describe_model(policy)
    settings = config.describe() | {"env": config.env, "model": model.get("sha256") or model["spec"]}
    claim_folder(config.out_dir, settings)
    path = config.out_dir / TRAJECTORIES_FILE
    try:
        previous = load_previous(path, config.env)
    except ValueError as exc:
        raise UsageError(f"cannot resume from {path}: {exc}") from None
    finished = {
        spec: t for spec in plan if (t := previous.get((spec.task_id, spec.sample))) and not t.errored
    }
    todo = [spec for spec in plan if spec not in finished]
    if on_resume is not None and finished:
        on_resume(list(finished.values()))
    if on_plan is not None:
        on_plan(len(plan), len(finished))
    start = time.perf_counter()
    with TrajectoryWriter(path) as writer:

        def record(trajectory: Trajectory) -> None:
            writer.write(trajectory)
            if on_episode is not None:
                on_episode(trajectory)

        ran = await run_episodes(url, policy, todo, config.seeded_rollout(), token=token, on_episode=record)
    results = {
        "env": config.env,
        "split": config.split,
        "policy": policy.name,
        "model": describe_model(policy),
        "seed": config.seed,
        "format": config.rollout.format,
        "temperature": config.rollout.sampling.temperature,
        "max_turns": config.rollout.max_turns or metadata.max_turns,
        "config": config.describe(),
        **source_revision(),
        **summarize([*finished.values(), *ran], config.k, ran, time.perf_counter() - start),
    }
    write_json(config.out_dir / RESULTS_FILE, results)
    return results


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees half a results file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


# ----- expert datasets ------------------------------------------------------------------

DATASET_FORMATS = ("trajectory", "agentgym")
"""``collect`` output: our trajectory records, or AgentGym conversations."""


async def collect(
    url: str,
    policy: Policy,
    env: str,
    out: Path,
    *,
    split: str = "train",
    n: int | None = None,
    rollout: RolloutConfig | None = None,
    output_format: str = "trajectory",
    only_success: bool = True,
    token: str | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    resume: bool = False,
) -> dict[str, int]:
    """Play one episode per task of ``split`` and write a dataset to ``out`` (replaced):
    one JSON line per episode, kept when it succeeded (or, with ``only_success=False``,
    when it did not error). AgentGym conversations cannot mark an error, so errored
    episodes are never written. ``resume``: keep ``out``'s records and play only the tasks
    it lacks (those not written before are played again). Returns ``{"episodes",
    "written", "errored", "kept"}``: this call's episodes, and the split's tasks ``out``
    already held."""
    from agentgym.records.trajectory import to_agentgym

    if output_format not in DATASET_FORMATS:
        raise UsageError(
            f"unknown dataset format {output_format!r}; choose one of {', '.join(DATASET_FORMATS)}"
        )
    await check_server(url, env, token)
    plan = plan_episodes(await list_tasks(url, split, n, token), 1, split)
    if not resume:
        out.unlink(missing_ok=True)
    with TrajectoryWriter(out) as writer:  # opening it cuts a torn last line, a crash's
        kept = collected_tasks(out, env)
        todo = [spec for spec in plan if spec.task_id not in kept]
        if on_plan is not None:
            on_plan(len(plan), len(plan) - len(todo))
        counts = Counter(episodes=0, written=0, errored=0, kept=len(plan) - len(todo))

        def record(trajectory: Trajectory) -> None:
            counts["episodes"] += 1
            counts["errored"] += trajectory.errored
            if trajectory.success or not (only_success or trajectory.errored):
                writer.write(to_agentgym(trajectory) if output_format == "agentgym" else trajectory)
                counts["written"] += 1
            if on_episode is not None:
                on_episode(trajectory)

        await run_episodes(url, policy, todo, rollout, token=token, on_episode=record)
    return dict(counts)
