"""Services every training regime uses: the expert's demonstrations (behaviour cloning,
the ``fits-horizon`` curriculum, AgentEvol's expert set) and greedy play with the current
weights (held-out evaluation, the ``unsolved`` curriculum). Each reads the run through
:class:`ServiceContext`, the part of a run's :class:`~agentgym.trainers.context.TrainingContext`
they need."""

from __future__ import annotations

import logging
import random
import time
from typing import Any, Protocol

from agentgym.agents import get_format
from agentgym.play.rollout import EpisodeSpec, run_episodes
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.chat import end_of_turn_id, reply_ids
from agentgym.records.run_folder import RunDir
from agentgym.records.trajectory import Trajectory, TrajectoryWriter, read_trajectories
from agentgym.trainers.batch import token_record
from agentgym.trainers.collector import Collector, rollout_config, sampling
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.figures import average, rollout_stats
from agentgym.trainers.learner import Learner

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
        """Run ``coroutine`` to its end on the run's event loop."""
        ...


class TokenizedExpert:
    """The environment's expert as a token-level policy: its reply is the expert action in
    the agent format, tokenized as a model reply (ending with the end-of-turn token), so
    behaviour cloning trains on exactly the tokens the model should emit.

    With ``epsilon`` > 0 it is an imperfect teacher: at each turn, with that probability, it
    plays one of the env's valid commands drawn uniformly instead, the draw seeded by
    ``seed``, the task, the sample and the turn (the same run plays the same
    demonstrations). :attr:`turns` counts the turns it played, :attr:`blind` those where
    the env listed no commands to draw from."""

    name = "expert"

    def __init__(
        self, tokenizer: Any, epsilon: float = 0.0, seed: int = 0, agent_format: str = "react"
    ) -> None:
        self.tokenizer = tokenizer
        self.end_id = end_of_turn_id(tokenizer)
        self.epsilon, self.seed = epsilon, seed
        self.turns = self.blind = 0
        self.render = get_format(agent_format).render

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        replies = []
        for request in requests:
            action = self._action(request.info)
            ids = reply_ids(self.tokenizer, action, self.end_id)
            replies.append(Generation(action, ids, [0.0] * len(ids), "stop"))
        return replies

    def _action(self, info: dict[str, Any]) -> str:
        """The expert's action (already in the agent format), or the teacher's random one."""
        valid = info.get("available_actions")
        if not self.epsilon:
            return info["expert_action"]
        self.turns += 1
        if not valid:
            self.blind += 1
            return info["expert_action"]
        draw = random.Random(f"{self.seed}:{info['task_id']}:{info['sample']}:{info['turn']}")
        return self.render(draw.choice(valid)) if draw.random() < self.epsilon else info["expert_action"]

    async def close(self) -> None:
        return None


class ExpertDemonstrations:
    """The expert's won episodes on the train tasks, played once per run (and, with
    ``bc_teacher_epsilon``, the imperfect teacher's on the tasks cloned)."""

    def __init__(self, run: ServiceContext) -> None:
        self.run = run
        self.played: dict[str, list[Trajectory]] = {}
        """Won episodes by file in the run folder: ``expert.jsonl``, ``teacher.jsonl``."""

    def records(self) -> list[dict[str, Any]]:
        """Token records of the demonstrations on the first ``bc_episodes`` train tasks."""
        cloned = set(self.run.train_tasks[: self.run.config.bc_episodes])
        records = [token_record(t) for t in self.cloneable() if t.task_id in cloned]
        if not records:
            raise RuntimeError(
                f"no demonstration won any of the first {len(cloned)} train tasks: nothing to clone"
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
        """The demonstrations short enough to clone (``bc_max_tokens``): the expert's, or
        the imperfect teacher's (``bc_teacher_epsilon``)."""
        config = self.run.config
        if config.bc_teacher_epsilon:
            teacher = TokenizedExpert(
                self.run.tokenizer, config.bc_teacher_epsilon, config.seed, config.agent_format
            )
            demonstrations = self._won("teacher.jsonl", self.run.train_tasks[: config.bc_episodes], teacher)
        else:
            demonstrations = self.episodes()
        return [e for e in demonstrations if len(e.token_ids) <= config.bc_max_tokens]

    def episodes(self) -> list[Trajectory]:
        """The expert's won episodes on train tasks: on the first ``bc_episodes`` (to
        clone), and with ``curriculum: fits-horizon`` on every train task (RL draws from
        those the expert finishes within the horizon, however long their text)."""
        config, tasks = self.run.config, self.run.train_tasks
        every = config.curriculum != "all"
        played = tasks if every else tasks[: config.bc_episodes]
        return self._won("expert.jsonl", played, TokenizedExpert(self.run.tokenizer))

    def _won(self, name: str, tasks: list[str], player: TokenizedExpert) -> list[Trajectory]:
        """``player``'s won episodes on ``tasks``, played once per run and kept in the run
        folder as ``name``."""
        if name not in self.played:
            run = self.run
            path = run.run_dir.path / name
            if run.dp.main and (not path.exists() or not read_trajectories(path)):
                specs = [EpisodeSpec(t, split="train") for t in tasks]
                rollout = rollout_config(run.config, max_turns=None)
                episodes = run.complete(run_episodes(run.url, player, specs, rollout))
                order = {task: i for i, task in enumerate(tasks)}
                with TrajectoryWriter(path) as writer:  # in task order, not the order they ended in:
                    # cloning's minibatches are drawn from this list, so a seed gives the same ones
                    for e in sorted(episodes, key=lambda e: order[e.task_id]):
                        if e.success and e.token_ids:
                            writer.write(e)
            if player.turns and player.blind == player.turns:  # it would pass the expert off as imperfect
                raise RuntimeError(
                    "bc_teacher_epsilon: the env listed no valid commands on any turn, so the teacher "
                    "had nothing to draw from; it needs an env that lists them (available_actions)"
                )
            run.dp.barrier()  # the other ranks read what rank 0 wrote
            self.played[name] = read_trajectories(path)
            if not self.played[name]:
                raise RuntimeError(f"{name}: no train task won, nothing to clone")
        return self.played[name]


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
