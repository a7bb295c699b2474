"""``agentgym train --engine trl``: a run of our config on TRL's loop, writing our run folder.

The folder is the one our engine writes, so ``eval``, ``export``, ``serve-model``, ``view``
and ``plot`` read it unchanged: ``config.yaml``, ``play.json``, one ``metrics.jsonl``
record per step (one of our steps is one TRL generation round: ``build.py``), its
episodes in ``rollouts/``, a checkpoint of the trained weights after each step, the
held-out panel greedily before and after, ``manifest.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from accelerate.utils import gather_object
from transformers import TrainerCallback

from agentgym.play.play_profile import write_play
from agentgym.play.rollout import EpisodeSpec, run_episodes
from agentgym.policies.dtypes import dtype_name
from agentgym.records.run_folder import MetricsLog, RunDir
from agentgym.trainers import heldout, manifest
from agentgym.trainers.collector import held_out_play, rollout_config, sampling, write_step_episodes
from agentgym.trainers.figures import rollout_stats
from agentgym.trainers.loop import env_server, split_task_ids
from agentgym.trainers.services import panel_figures
from agentgym.trainers.trl_engine.build import check_for_trl, grpo_args, trl_trainer
from agentgym.trainers.trl_engine.episodes import optimizer_steps_per_round, playing

TRL_FIGURES = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "entropy": "entropy",
    "clip_low": "clip_low",
    "clip_high": "clip_high",
    "positive_share": "positive_share",
    "bounds_moved": "bounds_moved",
    "clip_ratio/region_mean": "clip_frac",
    "step_time": "update_s",
}
"""TRL's figures a step record keeps (their mean over the step's optimizer steps), by the
names our engine's records use."""


class RunFolder(TrainerCallback):
    """Our run folder from TRL's callbacks: a step's record and checkpoint when a round's
    optimizer steps are done, the held-out panel before the first and after the last."""

    def __init__(
        self, trainer: Any, run_dir: RunDir, url: str, test_tasks: list[str], resume_step: int | None = None
    ) -> None:
        self.trainer, self.run_dir, self.url = trainer, run_dir, url
        self.config = trainer.agentgym_config
        self.test_tasks = test_tasks[: self.config.eval_tasks]
        # A resumed run keeps the records up to its checkpoint (the start's evaluation among them).
        self.metrics = MetricsLog(run_dir.metrics_path, resume_step=resume_step)
        self.logged: dict[str, list[float]] = defaultdict(list)
        self.per_round = optimizer_steps_per_round(trainer)
        self.finished_at = 0
        self.round_started = time.perf_counter()

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        started = any(record.get("phase") == "start" for record in self.metrics.read())
        if state.is_world_process_zero and not started:
            self.metrics.log({"step": 0, "phase": "start", **self.evaluate(0)})
        self.round_started = time.perf_counter()

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """TRL logs after every optimizer step (``on_step_end`` comes before the step's log):
        a round's record is written once its last optimizer step has logged."""
        for key, value in (logs or {}).items():
            if isinstance(value, int | float):
                self.logged[key].append(float(value))
        done = state.global_step and state.global_step % self.per_round == 0
        if done and state.global_step != self.finished_at:
            self.finished_at = state.global_step
            # Every rank played its share of the round: the record holds them all.
            episodes = gather_object(list(self.trainer.episodes.last.episodes))
            if state.is_world_process_zero:
                self.finish_round(state, kwargs["optimizer"], episodes)

    def finish_round(self, state: Any, optimizer: Any, episodes: list[Any]) -> None:
        played = self.trainer.episodes.last
        step = played.step
        write_step_episodes(self.run_dir.path, "rollouts", step, episodes)
        record = {"step": step, "phase": "rl", "engine": "trl", "max_turns": played.max_turns}
        record["step_s"] = round(time.perf_counter() - self.round_started, 2)  # rollouts and updates
        record["rollout_s"] = played.rollout_s
        record |= rollout_stats(episodes)
        record |= {
            ours: statistics.fmean(self.logged[trl]) for trl, ours in TRL_FIGURES.items() if self.logged[trl]
        }
        self.logged.clear()
        if step == self.config.steps:
            record |= self.evaluate(step)
        self.metrics.log(record)
        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        saved = {"engine": "trl", "trl_global_step": state.global_step}
        self.run_dir.save_checkpoint(step, model, optimizer, saved, keep=self.config.keep_checkpoints)
        self.round_started = time.perf_counter()

    def evaluate(self, step: int) -> dict[str, Any]:
        """Greedy play of the test panel at the held-out turn limit, kept in ``rollouts/eval``."""
        policy = self.trainer.episodes.policy_for(self.trainer)
        config = self.config
        rollout = rollout_config(config, config.eval_horizon, sampling(config, greedy=True))
        specs = [EpisodeSpec(task, split="test") for task in self.test_tasks]
        with playing(policy, self.trainer):
            episodes = asyncio.run(run_episodes(self.url, policy, specs, rollout))
        write_step_episodes(self.run_dir.path, "rollouts/eval", step, episodes)
        return panel_figures(episodes, "eval")

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.metrics.close()
        if not state.is_world_process_zero:
            return
        records = self.metrics.read()
        before, after = heldout.outcomes_by_phase(records)
        record = manifest.build_manifest(
            tasks=sorted(before.keys() | after.keys()),
            seeds=[self.config.seed],
            model_sha256=manifest.source_sha256(self.trainer.episodes.source),
            generator="hf",
            config=self.config.to_dict() | {"engine": "trl"},
            outcomes=heldout.evaluations(records),
            dtype=dtype_name(self.trainer.accelerator.unwrap_model(self.trainer.model).dtype),
        )
        manifest.write_manifest(self.run_dir.path, record)


def train_on_trl(config: Any, run_dir: Path, resume: bool = False) -> Path:
    """Train ``config`` on TRL into ``run_dir``: in this process, or in each process
    ``accelerate launch`` started (every one plays its share of each round on its own env
    server; the first writes the run folder). ``resume``: continue from the newest TRL
    checkpoint in ``run_dir/trl`` (weights, optimizer, schedule, random states, where the
    sampler was), written at the end of every round; the records of later rounds are cut."""
    folder = RunDir(run_dir)
    shape = check_for_trl(config, int(os.environ.get("WORLD_SIZE", "1")))
    checkpoint = newest_trl_checkpoint(folder.path) if resume else None
    # Only the newest TRL checkpoint is kept: a resume needs no other, and ours keep the weights.
    args = grpo_args(config, str(folder.path / "trl"), save_strategy="steps", save_steps=shape.per_round,
                     save_total_limit=1)  # fmt: skip
    with env_server(config, folder.path / f"env-{os.environ.get('RANK', '0')}.log") as url:
        _, ids = asyncio.run(split_task_ids(url))
        trainer = trl_trainer(config, url, ids["train"], args)
        if trainer.accelerator.is_main_process:
            config.save(folder.path / "config.yaml")
            write_play(folder.path, held_out_play(config, dtype_name(trainer.model.dtype)))
        resume_step = None if not resume else trained_rounds(checkpoint, shape.per_round)
        trainer.add_callback(RunFolder(trainer, folder, url, ids["test"], resume_step))
        try:
            trainer.train(resume_from_checkpoint=None if checkpoint is None else str(checkpoint))
        finally:
            trainer.episodes.close()
    return folder.path


def newest_trl_checkpoint(run_dir: Path) -> Path | None:
    """TRL's newest checkpoint in ``run_dir/trl`` (None before the first round ended)."""
    from transformers.trainer_utils import get_last_checkpoint

    trl_dir = run_dir / "trl"
    found = get_last_checkpoint(str(trl_dir)) if trl_dir.is_dir() else None
    return None if found is None else Path(found)


def trained_rounds(checkpoint: Path | None, per_round: int) -> int:
    """Our steps a TRL checkpoint holds (0 for none): its optimizer steps over a round's."""
    if checkpoint is None:
        return 0
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    return state["global_step"] // per_round


def launch_command(nproc: int, run_dir: Path, resume: bool = False) -> list[str]:
    """``accelerate launch`` of :func:`main` in ``nproc`` processes. With an accelerate
    config (``accelerate config``: DeepSpeed, FSDP, several nodes) that config decides;
    without one, ``--multi_gpu``: accelerate's torchrun launcher, which on a machine without
    GPUs runs the processes on the CPU over gloo (its ``--cpu`` would start one process),
    on a free port (accelerate's default 29500 would clash with a second job here)."""
    from accelerate.commands.config import default_config_file

    configured = os.path.isfile(os.environ.get("ACCELERATE_CONFIG_FILE", default_config_file))
    on_this_machine = ["--multi_gpu", "--main_process_port", "0"]
    return [sys.executable, "-m", "accelerate.commands.launch", *([] if configured else on_this_machine),
            "--num_processes", str(nproc), "-m", "agentgym.trainers.trl_engine.run", str(run_dir),
            *(["--resume"] if resume else [])]  # fmt: skip


def main() -> None:
    """``python -m agentgym.trainers.trl_engine.run RUN_DIR [--resume]``: train the config
    saved there (continue it from its newest TRL checkpoint)."""
    from agentgym.trainers.config import TrainConfig

    run_dir = Path(sys.argv[1])
    train_on_trl(TrainConfig.load(run_dir / "config.yaml"), run_dir, resume="--resume" in sys.argv[2:])


if __name__ == "__main__":
    main()
