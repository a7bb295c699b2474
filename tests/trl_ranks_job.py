"""Run by tests/test_trl.py under ``accelerate launch --num_processes 2``: one short BAPO
round on TRL against a textworld server, every optimizer step recorded by each rank into
``OUT/rank-R.pt``. Arguments: URL MODEL_DIR OUT."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from test_trl import Recorded, tasks, tiny_bapo_config

from agentgym.trainers.trl_engine.build import grpo_args, trl_trainer


def main(url: str, model_dir: str, out: str) -> None:
    config = tiny_bapo_config(Path(model_dir), steps=1, micro_batch_size=1)
    recorded = Recorded(pytest.MonkeyPatch())
    trainer = trl_trainer(config, url, tasks(url, "train"), grpo_args(config, out))
    trainer.train()
    trainer.episodes.close()
    torch.save(recorded.steps, Path(out) / f"rank-{trainer.accelerator.process_index}.pt")


if __name__ == "__main__":
    main(*sys.argv[1:4])
