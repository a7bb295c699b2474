"""Services every training regime uses: the expert's demonstrations (behaviour cloning,
the ``fits-horizon`` curriculum, AgentEvol's expert set) and greedy play with the current
weights (held-out evaluation, the ``unsolved`` curriculum). Each reads the run through
:class:`ServiceContext`, what the trainer offers them."""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.chat import end_of_turn_id, reply_ids
from agentgym.rollout import EpisodeSpec, run_episodes
from agentgym.run_folder import RunDir
from agentgym.trainers.batch import token_record
from agentgym.trainers.collector import Collector, rollout_config, sampling
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.figures import average, rollout_stats
from agentgym.trainers.learner import Learner
from agentgym.trajectory import Trajectory, TrajectoryWriter, read_trajectories

log = logging.getLogger(__name__)


class ServiceContext(Protocol):
    """What the services read of the run."""

    config: Any
    learner: Learner
    collector: Collector
    dp: DataParallel
    run_dir: RunDir
    url: str
    """The env server's URL."""
    tokenizer: Any
    train_tasks: list[str]
    validation_tasks: list[str]
    test_tasks: list[str]

    def complete(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to its end on the trainer's event loop."""
        ...


class TokenizedExpert:
    """The environment's expert as a token-level policy: its reply is the expert action in
    the agent format, tokenized as a model reply (ending with the end-of-turn token), so
    behaviour cloning trains on exactly the tokens the model should emit."""

    name = "expert"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.end_id = end_of_turn_id(tokenizer)

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        replies = []
        for request in requests:
            ids = reply_ids(self.tokenizer, request.info["expert_action"], self.end_id)
            replies.append(Generation(request.info["expert_action"], ids, [0.0] * len(ids), "stop"))
        return replies

    async def close(self) -> None:
        return None


class ExpertDemonstrations:
    """The expert's won episodes on the train tasks, played once per run."""

    def __init__(self, run: ServiceContext) -> None:
        self.run = run
        self.expert: list[Trajectory] | None = None

    def records(self) -> list[dict[str, Any]]:
        """Token records of the expert's episodes on the first ``bc_episodes`` train tasks."""
        cloned = set(self.run.train_tasks[: self.run.config.bc_episodes])
        records = [token_record(t) for t in self.cloneable() if t.task_id in cloned]
        if not records:
            raise RuntimeError(
                f"the expert solved none of the first {len(cloned)} train tasks: nothing to clone"
            )
        return records

    def turns(self) -> dict[str, int]:
        """Turns the expert took on each train task it solved; empty for an env without one."""
        try:
            return {e.task_id: e.turns for e in self.episodes()}
        except (RuntimeError, ValueError) as exc:
            log.warning("curriculum fits-horizon: no expert episodes (%s); RL draws every task", exc)
            return {}

    def cloneable(self) -> list[Trajectory]:
        """The expert episodes short enough to clone (``bc_max_tokens``)."""
        limit = self.run.config.bc_max_tokens
        return [e for e in self.episodes() if len(e.token_ids) <= limit]

    def episodes(self) -> list[Trajectory]:
        """The expert's won episodes on train tasks, played once per run and kept in the run
        folder: on the first ``bc_episodes`` (to clone), and with ``curriculum:
        fits-horizon`` on every train task (RL draws from those the expert finishes within
        the horizon, however long their text)."""
        if self.expert is None:
            run, config = self.run, self.run.config
            path = run.run_dir.path / "expert.jsonl"
            if run.dp.main and (not path.exists() or not read_trajectories(path)):
                every = config.curriculum != "all"
                tasks = run.train_tasks if every else run.train_tasks[: config.bc_episodes]
                specs = [EpisodeSpec(t, split="train") for t in tasks]
                rollout = rollout_config(config, max_turns=None)
                episodes = run.complete(run_episodes(run.url, TokenizedExpert(run.tokenizer), specs, rollout))
                order = {task: i for i, task in enumerate(tasks)}
                with TrajectoryWriter(path) as writer:  # in task order, not the order they ended in:
                    # cloning's minibatches are drawn from this list, so a seed gives the same ones
                    for e in sorted(episodes, key=lambda e: order[e.task_id]):
                        if e.success and e.token_ids:
                            writer.write(e)
            run.dp.barrier()  # the other ranks read what rank 0 wrote
            self.expert = read_trajectories(path)
            if not self.expert:
                raise RuntimeError("the expert solved no train task: nothing to clone")
        return self.expert


class GreedyPlay:
    """Greedy episodes with the current weights, kept in the run folder."""

    def __init__(self, run: ServiceContext) -> None:
        self.run = run

    def solved_at_start(self, step: int) -> set[str]:
        """``curriculum: unsolved``: the train tasks (those the expert finishes within the
        longest horizon) that the policy wins in greedy play at that horizon at the start of
        RL. Played once per run; the episodes are kept in ``rollouts/frontier/``, so a
        resumed run reads the same set instead of asking its partly trained policy."""
        run, config = self.run, self.run.config
        played = sorted((run.run_dir.path / "rollouts" / "frontier").glob("step-*.jsonl"))
        if played:
            episodes = read_trajectories(played[0])
        else:
            tasks = run.collector.pool(config.longest_horizon)
            specs = [EpisodeSpec(t, split="train") for t in tasks]
            episodes = self.play(step, specs, config.longest_horizon, "frontier")
        solved = {e.task_id for e in episodes if e.success}
        log.info(
            "curriculum unsolved: the policy wins %d of %d train tasks greedily", len(solved), len(episodes)
        )
        return solved

    def evaluate(self, step: int, split: str = "test") -> dict[str, Any]:
        """Greedy success at ``eval_horizon`` on the first ``eval_tasks`` test tasks (the
        before/after panel, ``eval_*`` keys) or the first ``val_tasks`` validation tasks
        (``split="validation"``, ``val_*`` keys): the rate, and each task's outcome (for the
        before/after comparison, ``heldout.py``). The episodes are kept in
        ``rollouts/eval/step-N.jsonl`` or ``rollouts/validation/step-N.jsonl`` (the viewer
        lists them beside the training episodes)."""
        run, config = self.run, self.run.config
        if split == "validation":
            tasks, prefix, folder = run.validation_tasks[: config.val_tasks], "val", "validation"
        else:
            tasks, prefix, folder = run.test_tasks[: config.eval_tasks], "eval", "eval"
        specs = [EpisodeSpec(t, split=split) for t in tasks]
        started = time.perf_counter()
        figures = panel_figures(self.play(step, specs, config.eval_horizon, folder), prefix)
        return figures | {f"{prefix}_s": round(time.perf_counter() - started, 2)}  # where a run's time goes

    def play(self, step: int, specs: list[EpisodeSpec], max_turns: int, folder: str) -> list[Trajectory]:
        """Play ``specs`` greedily within ``max_turns`` with the current weights; the
        episodes are kept in ``rollouts/<folder>/step-N.jsonl``."""
        run, config = self.run, self.run.config
        rollout = rollout_config(config, max_turns, sampling(config, greedy=True))
        if config.mode == "async":  # the generator is busy with the next step, a version behind
            episodes = run.complete(run_episodes(run.url, run.learner.policy, specs, rollout))
        else:
            run.collector.publish()
            episodes = run.complete(run.collector.generator.evaluate(specs, rollout))
        run.collector.record(step, episodes, folder=f"rollouts/{folder}")
        return episodes


def panel_figures(episodes: list[Trajectory], prefix: str) -> dict[str, Any]:
    """A held-out panel's figures (``eval_*`` for the test panel, ``val_*`` for validation):
    the success rate, invalid replies, context overflows, and each task's outcome (for the
    before/after comparison, ``heldout.py``)."""
    outcomes = {e.task_id: float(e.success) for e in episodes}
    stats = rollout_stats(episodes)
    return {
        f"{prefix}_success_rate": average(outcomes.values()),
        f"{prefix}_invalid_share": stats["invalid_share"],
        f"{prefix}_context_full": stats["context_full"],
        f"{prefix}_outcomes": outcomes,
    }
