"""Training from Python: what ``agentgym train`` does, in a few lines.

    from agentgym.trainers import train

    run = train({"algo": "grpo", "env": "choice", "steps": 10}, out="runs/mine")
    run = train({"env": "textworld"}, reward=lambda episode: episode.score - 0.02 * episode.turns)

``run`` is the run folder (``config.yaml``, ``metrics.jsonl``, checkpoints, ``curves.png``):
``agentgym eval --model run``, ``agentgym export run`` and ``agentgym view run`` take it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentgym.trainers.collector import RewardHook
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.config_files import default_run_folder, layered_config, saved_config
from agentgym.trainers.loop import Trainer
from agentgym.trainers.plot import plot_run


def train(
    config: TrainConfig | dict[str, Any] | None = None,
    *,
    out: str | Path | None = None,
    reward: RewardHook | None = None,
    resume: bool = False,
) -> Path:
    """Train and return the run folder.

    Args:
        config: a :class:`TrainConfig`, taken as it is, or a dict of its fields over the
            env's layer (what ``agentgym train --env ENV --set KEY=VALUE`` resolves).
        out: the run folder (default ``config.output_dir``, else ``runs/<algo>-<env>-<time>``).
        reward: rescores each finished episode before its advantage
            (:data:`~agentgym.trainers.collector.RewardHook`); rollouts and metrics keep the
            env's score. Not saved with the run: pass it again to ``resume``.
        resume: continue the run in ``out`` from its newest complete checkpoint, with its
            saved config (``config`` is then ignored).
    """
    if resume:
        if out is None:
            raise ValueError("resume needs out: the run folder to continue")
        resolved = saved_config(Path(out))
    elif isinstance(config, TrainConfig):
        resolved = config
    else:
        resolved = layered_config(dict(config or {}))
    folder = Path(out or resolved.output_dir or default_run_folder(resolved))
    resolved = resolved.with_overrides({"output_dir": str(folder.absolute())})
    run = Trainer(resolved, folder, resume=resume, reward=reward).run()
    plot_run(run)
    return run
