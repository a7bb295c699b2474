"""BAPO on TRL's GRPOTrainer against an env server you run: the pieces ``agentgym train
--engine trl`` puts together, without its run folder. Copy it and change the config.

    agentgym serve choice --port 8000 &
    python docs/examples/trl_bapo.py --url http://127.0.0.1:8000 --out runs/trl-choice

Under ``accelerate launch`` (``--num_processes N``, a DeepSpeed or FSDP config) it runs as is:
TRL's trainer takes its processes from the launcher. ``tests/test_trl.py`` runs this file.
"""

from __future__ import annotations

import argparse
import asyncio

from agentgym.trainers.config import TrainConfig
from agentgym.trainers.loop import split_task_ids
from agentgym.trainers.trl_engine.build import grpo_args, trl_trainer


def main() -> None:
    parser = argparse.ArgumentParser(description="BAPO on TRL against an agentgym env server")
    parser.add_argument("--url", required=True, help="the env server (agentgym serve choice)")
    parser.add_argument("--out", default="runs/trl-choice", help="TRL's output folder")
    parser.add_argument("--model", default="smollm2-135m", help="a model alias, folder or hub id")
    parser.add_argument("--steps", type=int, default=6, help="our steps: one TRL generation round each")
    options = parser.parse_args()
    config = TrainConfig(
        algo="bapo",
        env="choice",
        env_url=options.url,
        model=options.model,
        steps=options.steps,
        bc_steps=0,  # TRL trains from a model; clone with our engine first if you need it
        curriculum="all",
        schedule="fixed",
        max_turns=1,
        agent_format="plain",
        max_new_tokens=6,
        tasks_per_step=2,
        group_size=8,
        minibatch_size=16,
        micro_batch_size=8,
        loss_aggregation="token-mean",
    )
    train_tasks = asyncio.run(split_task_ids(options.url))[1]["train"]
    trainer = trl_trainer(config, options.url, train_tasks, grpo_args(config, options.out))
    trainer.train()
    for record in trainer.state.log_history:
        if "reward" in record:
            print(
                f"optimizer step {record['step']}: reward {record['reward']:.3f}, loss {record['loss']:.4f}"
            )


if __name__ == "__main__":
    main()
