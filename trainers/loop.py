"""The trainer: a short loop that runs, at each step, the regime its algorithm names.

Steps are numbered globally and checkpointed: steps ``1..bc_steps`` clone demonstrations
(the warm start, AgentEvol's first stage), the rest are steps of the algorithm's regime
(``trainers/regimes.py``, ``trainers/agentevol/``, ``trainers/critique_rl/``). The pieces:
the learner (weights, optimizer, log-probs, KL reference), the collector (generator,
rollouts, replay), the registry (``--algo`` names). ``resume`` restarts after the newest
complete checkpoint, with the same weights, optimizer, RNG, schedule position, replay
buffer and metrics, so a killed run continues exactly (an async run's in-flight rollouts
and paused episodes are played anew).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pkgutil
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from agentgym.clients.openenv_client import env_client, is_openenv_url, openenv_task_ids
from agentgym.contract.core import resolve_split
from agentgym.play.play_profile import write_play
from agentgym.policies.dtypes import dtype_name
from agentgym.policies.hf import HFPolicy
from agentgym.progress import make_console
from agentgym.progress import progress as progress_display
from agentgym.records.run_folder import MetricsLog, RunDir
from agentgym.trainers import heldout, manifest
from agentgym.trainers.collector import Collector, RewardHook, held_out_play
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.context import TrainingContext
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.generators import start_generator
from agentgym.trainers.guards import CollapseGuard
from agentgym.trainers.learner import Learner
from agentgym.trainers.regimes import behaviour_cloning
from agentgym.trainers.reporting import open_sinks
from agentgym.trainers.schedules import schedule_of

log = logging.getLogger(__name__)

REPLAY_FILE = "replay.jsonl"
"""The replay buffer's samples, saved inside each checkpoint folder."""


class SetupError(ValueError):
    """The run cannot start on this env (``agentgym train`` exits 2 with the message)."""


class Trainer:
    def __init__(
        self,
        config: TrainConfig,
        run_dir: str | Path,
        *,
        resume: bool = False,
        reward: RewardHook | None = None,
    ) -> None:
        self.config = config
        self.reward = reward
        """A custom reward (:data:`~agentgym.trainers.collector.RewardHook`); None: the env's score."""
        self.run_dir = RunDir(run_dir)
        self.resume = resume
        self.schedule = schedule_of(config)
        self.regime_class = pkgutil.resolve_name(config.preset.regime)  # the preset names it
        self.total_steps = config.bc_steps + self.regime_class.rl_steps(config)
        # Set up by run(): the process group, the env server, the event loop, the model.
        self.dp = DataParallel()
        self.url = ""
        self.runner: asyncio.Runner | None = None
        self.learner: Learner | None = None
        self.tokenizer: Any = None
        self.pad_id = 0
        self.train_tasks: list[str] = []
        self.validation_tasks: list[str] = []
        """What the trainer's choices read (``eval_every``, the best checkpoint)."""
        self.test_tasks: list[str] = []
        """The before/after report's panel, played at those two points only."""
        self.collector: Collector | None = None
        self.context: TrainingContext | None = None
        """What the regime gets of the run (``context.py``), once it is set up."""
        self.regime: Any = None
        self.metrics: MetricsLog | None = None
        self.guard = CollapseGuard(config.entropy_floor, config.invalid_rise)

    # ----- the whole algorithm -------------------------------------------------------

    def run(self) -> Path:
        torch.manual_seed(self.config.seed)  # the same on every rank: identical initial adapters
        random.seed(self.config.seed)
        self.dp = DataParallel.from_env()
        try:
            # One event loop for the whole run: a vLLM engine stays bound to the loop it started on.
            with (
                env_server(self.config, self.run_dir.path / "env.log") as self.url,
                asyncio.Runner() as self.runner,
            ):
                self._set_up()
                try:
                    self._train_from(self._restore())
                finally:
                    if self.metrics is not None:
                        self.metrics.close()  # finishes a W&B run
                    if self.collector is not None:
                        self.complete(self.collector.generator.close())
        finally:
            self.dp.close()
        return self.run_dir.path

    def _train_from(self, start: int) -> None:
        if self.dp.main:
            resume_step = start - 1 if self.resume else None
            config = self.config
            sinks = open_sinks(
                config.report_to, self.run_dir.path, config.to_dict(), config.wandb_project, resume_step
            )
            self.metrics = MetricsLog(self.run_dir.metrics_path, resume_step=resume_step, sinks=sinks)
        self._set_version(start - 1)
        if self.dp.main and start == 1:
            self._evaluate_untrained()
        with _progress(visible=self.dp.main) as progress:
            bar = progress.add_task("training", total=self.total_steps, completed=start - 1)
            for step in range(start, self.total_steps + 1):
                started, cpu = time.perf_counter(), psutil.cpu_times()
                if step <= self.config.bc_steps:
                    record = behaviour_cloning(self.context, step, self.regime.demonstrations())
                else:
                    if step == self.config.bc_steps + 1 and self.config.rl_optimizer == "fresh":
                        self.learner.optimizer.state.clear()  # RL's updates owe nothing to cloning's
                    record = self.regime.step(step)
                self._set_version(step)
                record.update(step_s=round(time.perf_counter() - started, 2), cpu_idle_share=_idle_share(cpu))
                record |= {"finished_at": round(time.time(), 2)} | _device_peak(self.learner.device)
                record.setdefault("lr", self.learner.optimizer.param_groups[0]["lr"])
                if self.dp.main:  # the other ranks go on to the next step and wait for rank 0 there
                    self._finish_step(step, record)
                progress.update(bar, advance=1, description=self._describe(record))
        if self.dp.main:
            self._report_before_after()

    def _describe(self, record: dict[str, Any]) -> str:
        """The progress bar's words for a step: cloning's loss, or what the regime says."""
        return f"bc  loss {record['loss']:.3f}" if record["phase"] == "bc" else self.regime.describe(record)

    def _finish_step(self, step: int, record: dict[str, Any]) -> None:
        """Rank 0: evaluate when due, log the step, checkpoint when due."""
        if self._validation_due(step):
            record.update(self.regime.evaluate(step, split="validation"))
        if self._eval_due(step):
            record.update(self.regime.evaluate(step))
        warnings = self.guard.check(record)
        if warnings:
            record["warnings"] = warnings
        self.metrics.log(record)
        if step % self.config.checkpoint_every == 0 or step == self.total_steps:
            files = {REPLAY_FILE: self.collector.replay.dumps()} if self.config.replay_ratio > 0 else {}
            learner = self.learner
            self.run_dir.save_checkpoint(
                step,
                learner.model,
                learner.optimizer,
                {"phase": record["phase"]},
                files,
                keep=self.config.keep_checkpoints,
            )

    def _evaluate_untrained(self) -> None:
        """With no behaviour cloning, the "before" of the before/after comparison is the
        untrained policy: evaluate it once, logged as step 0 (phase ``start``). A run
        resumed before its first checkpoint keeps the evaluation it already logged."""
        if self.config.bc_steps or any(r.get("phase") == "start" for r in self.metrics.read()):
            return
        self.metrics.log({"step": 0, "phase": "start"} | self.regime.evaluate(0))

    def _eval_due(self, step: int) -> bool:
        """The test panel: at the end of behaviour cloning (the "before" of RL) and at the
        last step (the "after"), nowhere else (no RL step: the end of cloning only)."""
        return step in (self.config.bc_steps, self.total_steps)

    def _validation_due(self, step: int) -> bool:
        """Validation, with ``eval_every`` > 0 and a validation split: every ``eval_every``
        RL steps, at the end of behaviour cloning and at the last step (so the best
        checkpoint can be the cloned one or the last one)."""
        every, t = self.config.eval_every, step - self.config.bc_steps
        if every <= 0 or not self.validation_tasks:
            return False
        return step in (self.config.bc_steps, self.total_steps) or (t > 0 and t % every == 0)

    def _report_before_after(self) -> None:
        """Print and save held-out success after behaviour cloning and after RL, and the
        run's manifest beside them (rank 0)."""
        records = self.metrics.read()
        before, after = heldout.outcomes_by_phase(records)
        self._write_manifest(sorted(before.keys() | after.keys()), heldout.evaluations(records))
        if not before or not after:
            return  # no RL step: nothing to compare
        result = heldout.compare([(before, after)])
        heldout.save(self.run_dir.path, result, sorted(before))
        table = Table(
            title=f"held-out success on {result.tasks} test tasks (greedy), % [95% interval]",
            caption=heldout.caption(result),
        )
        table.add_column("", no_wrap=True)
        table.add_column("%", justify="right")
        table.add_column("per-episode", justify="right")
        for label, claim, per_episode in heldout.rows(result, cloned=self.config.bc_steps > 0):
            table.add_row(label, claim, per_episode)
        make_console().print(table)

    def _write_manifest(self, tasks: list[str], outcomes: dict[str, Any]) -> None:
        """``manifest.json`` in the run folder (``trainers/manifest.py``); never fails the run."""
        try:
            policy = getattr(self.learner, "policy", None)
            source = getattr(policy, "source", None)
            model = getattr(policy, "model", None)
            record = manifest.build_manifest(
                tasks=tasks,
                seeds=[self.config.seed],
                model_sha256=manifest.source_sha256(source),
                generator=self.config.generator,
                config=self.config.to_dict(),
                outcomes=outcomes,
                dtype=dtype_name(model.dtype) if model is not None else None,
            )
            manifest.write_manifest(self.run_dir.path, record)
        except Exception as exc:
            log.warning("manifest.json not written: %s", exc)

    def complete(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to its end on the run's event loop."""
        return self.runner.run(coroutine)

    # ----- set-up and resume -----------------------------------------------------------

    def _set_version(self, version: int) -> None:
        """The policy version is the training steps done; tokens sampled from here on record it."""
        self.learner.policy.weights_version = version

    def _set_up(self) -> None:
        config = self.config
        if config.generator != "hf" and self.dp.world > 1:
            raise ValueError(f"generator: {config.generator} runs with one trainer process; use --nproc 1")
        self._list_tasks()  # before the model loads: an env that cannot train fails in seconds
        policy = HFPolicy(config.model, dtype=config.dtype, device=self.dp.device())
        if self.dp.main:  # the dtype it trains in is the one it plays, serves and exports in
            write_play(self.run_dir.path, held_out_play(config, dtype_name(policy.model.dtype)))
        self.tokenizer = policy.tokenizer
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.learner = Learner(config, policy, self.dp)
        if config.eval_every > 0 and not self.validation_tasks:
            log.warning("eval_every: the env has no validation split; no periodic evaluation")
        generator = self.complete(start_generator(config, self.learner, self.url))
        self.collector = Collector(
            config,
            self.learner,
            generator,
            self.runner,
            self.dp,
            self.train_tasks,
            self.run_dir.path,
            self.reward,
        )
        self.context = TrainingContext(
            config,
            self.learner,
            self.collector,
            self.dp,
            self.run_dir,
            self.url,
            self.tokenizer,
            self.pad_id,
            self.train_tasks,
            self.validation_tasks,
            self.test_tasks,
            self.total_steps,
            self.schedule,
            self.runner,
        )
        self.regime = self.regime_class(self.context)

    def _list_tasks(self) -> None:
        """The env's train, validation and test task ids; :class:`SetupError` when it has no
        train or no test tasks (RL draws from the one, the before/after report plays the other)."""
        if is_openenv_url(self.url):  # an OpenEnv env: its tasks are seeds
            self.train_tasks, self.test_tasks = openenv_task_ids("train"), openenv_task_ids("test")
            self.validation_tasks = openenv_task_ids("validation")
            return
        splits, ids = self.complete(split_task_ids(self.url))  # wire API v1 or MCP (env_client)
        for split in ("train", "test"):
            if split not in ids:
                raise SetupError(
                    f"env {self.config.env!r} has no {split} tasks (its splits: {splits or 'none'}): "
                    "training draws its episodes from train and reports on test; give the env "
                    "both splits (docs/environments.md)"
                )
        self.train_tasks, self.test_tasks = ids["train"], ids["test"]
        self.validation_tasks = ids.get("validation", [])  # never the test split's

    def _restore(self) -> int:
        """First step to run: 1, or the step after the newest complete checkpoint (ValueError
        on a folder with trained steps but no complete checkpoint: that would start over)."""
        checkpoint = self.run_dir.resume_checkpoint() if self.resume else None
        if checkpoint is None:
            if self.dp.main:
                self.config.save(self.run_dir.path / "config.yaml")
            return 1
        state = RunDir.load_checkpoint(checkpoint, self.learner.model, self.learner.optimizer)
        if (checkpoint / REPLAY_FILE).exists():
            self.collector.replay.load(checkpoint / REPLAY_FILE)
        log.info("resumed from %s (step %d)", checkpoint, state["step"])
        return state["step"] + 1


@contextlib.contextmanager
def env_server(config: TrainConfig, log_path: Path) -> Iterator[str]:
    """The URL of the env server a run trains on: ``config.env_url``, or a local server of
    ``config.env`` with its ``env_settings`` started for the run (logging to ``log_path``)."""
    if config.env_url:
        yield config.env_url
        return
    from agentgym.servers.launcher import start_server_process, wait_healthy

    args = ["--log-level", "warning", "--max-sessions", str(max(64, 2 * config.concurrency))]
    for key, value in config.env_settings.items():
        args += ["--set", f"{key}={value}"]
    server = start_server_process(config.env, extra_args=args, log_path=str(log_path))
    try:
        wait_healthy(server.url, 300, server.process)
        yield server.url
    finally:
        server.stop()


async def split_task_ids(url: str) -> tuple[dict[str, int], dict[str, list[str]]]:
    """The env's splits, and the task ids of those of its train, test and validation splits
    that have tasks."""
    async with env_client(url) as client:
        splits = (await client.metadata()).splits
        ids = {}
        for name in ("train", "test", "validation"):
            split = resolve_split(name, splits)  # dev: validation
            if splits.get(split):
                ids[name] = [t.task_id for t in (await client.tasks(split=split, limit=10_000)).tasks]
    return splits, ids


def _idle_share(since: Any) -> float:
    """Share of the machine's CPU time idle since the ``psutil.cpu_times()`` ``since``."""
    now = psutil.cpu_times()
    spent = {field: getattr(now, field) - getattr(since, field) for field in now._fields}
    total = sum(spent.values())
    idle = spent["idle"] + spent.get("iowait", 0.0)
    return round(idle / total, 3) if total > 0 else 0.0


def _device_peak(device: torch.device) -> dict[str, float]:
    """On CUDA: the step's peak memory held by torch's allocator (GiB), then the counter
    restarts for the next step; nothing elsewhere."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return {"gpu_peak_gib": round(peak, 2)}


def _progress(visible: bool = True) -> Any:
    """The steps' bar; plain flushed lines when the output is not a terminal."""
    columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return progress_display(make_console(), *columns, disable=not visible)
