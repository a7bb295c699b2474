"""Critics evaluated: test-time critique-then-refine on the problems of an env with an answer
key (math), and critique-then-replay on agent episodes (``agentgym eval --critic``). Both write ``critiques.jsonl`` and
``results.json`` into the run's folder; neither resumes (a re-run replaces both files).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentgym import registry
from agentgym.contract.errors import AgentGymError
from agentgym.contract.problems import Problem
from agentgym.play.critique import critique_and_replay, critique_metrics, critique_round, voting_accuracy
from agentgym.play.evaluation import RESULTS_FILE, UsageError, list_tasks, write_json
from agentgym.play.rollout import EpisodeSpec, RolloutConfig
from agentgym.policies.base import Policy, SamplingParams
from agentgym.records.trajectory import Trajectory

CRITIQUES_FILE = "critiques.jsonl"


def catalogue_problems(env: str, split: str, n: int | None) -> list[Problem]:
    """The first ``n`` problems of ``split`` of env ``env``'s default catalogue (an env with
    an answer key, :func:`~agentgym.registry.serves_problems`)."""
    catalog: Any = registry.make(env)
    try:
        tasks = catalog.tasks(split)
    except AgentGymError as exc:
        raise UsageError(exc.message) from None
    return [catalog.problem(t.task_id) for t in tasks[:n]]


async def evaluate_critic(
    env: str,
    actor: Policy,
    critic: Policy,
    problems: list[Problem],
    out_dir: Path,
    *,
    k: int,
    sampling: SamplingParams,
) -> dict[str, Any]:
    """Test-time critique-then-refine: ``k`` answers per problem, one critique each, a
    refinement where the critic says anything but Correct. Writes every record to
    ``<out>/critiques.jsonl`` and returns the results (also ``<out>/results.json``): the
    :func:`~agentgym.play.critique.critique_metrics` figures and, for ``k > 1``, plain and
    critique-filtered majority-vote accuracy. Not resumable: a re-run replaces both files."""
    start = time.perf_counter()
    key = registry.answer_key(env)
    records = await critique_round(
        actor, critic, problems, sampling, n_answers=k, refine_when_correct=False, key=key
    )
    _write_critiques(out_dir, [record.to_dict() for record in records])
    results = {
        "env": env,
        "policy": actor.name,
        "critic": critic.name,
        "problems": len(problems),
        "k": k,
        "temperature": sampling.temperature,
        **critique_metrics(r.outcome for r in records),
        **(voting_accuracy(records, key) if k > 1 else {}),
        "wall_s": round(time.perf_counter() - start, 3),
    }
    write_json(out_dir / RESULTS_FILE, results)
    return results


async def evaluate_episode_critic(
    url: str,
    actor: Policy,
    critic: Policy,
    env: str,
    split: str,
    n: int | None,
    out_dir: Path,
    *,
    rollout: RolloutConfig,
    token: str | None = None,
    on_plan: Callable[[int, int], None] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> dict[str, Any]:
    """Critique-then-replay on agent episodes: the actor plays the first ``n`` tasks of
    ``split``, the critic judges each episode, the actor replays each task with the critique
    (``on_plan(total, done)`` and ``on_episode`` see both the episodes and the replays).
    Writes ``<out>/critiques.jsonl`` (episode, critique, verdict, replay) and returns the
    :func:`~agentgym.play.critique.critique_metrics` figures (also ``<out>/results.json``)."""
    start = time.perf_counter()
    specs = [EpisodeSpec(task, split=split) for task in await list_tasks(url, split, n, token)]
    if on_plan:
        on_plan(2 * len(specs), 0)
    judged = await critique_and_replay(
        url, actor, critic, specs, rollout, rollout.sampling, token=token, on_episode=on_episode
    )
    _write_critiques(out_dir, [item.to_dict() for item in judged])
    results = {
        "env": env,
        "policy": actor.name,
        "critic": critic.name,
        "episodes": len(judged),
        **critique_metrics(item.outcome for item in judged),
        "wall_s": round(time.perf_counter() - start, 3),
    }
    write_json(out_dir / RESULTS_FILE, results)
    return results


def _write_critiques(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """``<out>/critiques.jsonl``, one record a line (replaced: critique evals do not resume)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / CRITIQUES_FILE, "w") as fh:
        fh.writelines(json.dumps(record) + "\n" for record in records)
