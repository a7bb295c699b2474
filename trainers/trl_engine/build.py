"""From a training config to a TRL run: the settings checked before any model loads, TRL's
``GRPOConfig`` derived from ours, the dataset of train task ids, the trainer.

How our step maps to TRL's: one of our steps plays ``tasks_per_step × group_size`` episodes
and takes ``episodes / minibatch_size × ppo_epochs`` optimizer steps. In TRL that is one
generation round of ``generation_batch_size`` = the episodes, each optimizer step
``micro_batch_size`` rows a process × ``gradient_accumulation_steps`` × processes =
``minibatch_size``, ``num_iterations`` = ``ppo_epochs``. A round is then a whole number of
optimizer steps, so the horizon of round ``k`` is our schedule's at step ``k + 1``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from agentgym.contract.errors import UsageError
from agentgym.trainers.presets import CLIPPED_RL

UNSUPPORTED = {
    "bc_steps": (0, "clone with our engine first (--steps 0), then train on TRL from that run (--model RUN)"),
    "dynamic_sampling": (False, "TRL's generation batch cannot be refilled"),
    "shuffle_advantages": (False, "the placebo arm runs on our engine"),
    "replay_ratio": (0.0, "TRL keeps no replay buffer"),
    "partial_rollout_tokens": (None, "TRL plays each round to the end"),
    "pack_tokens": (None, "TRL pads its micro-batches"),
    "loss_norm_tokens": (None, "TRL normalises by tokens"),
    "mode": ("sync", "TRL generates between its optimizer steps"),
    "generator": ("hf", "the rollouts sample from TRL's model in process"),
    "curriculum": ("all", "TRL's sampler draws every train task"),
}
"""Settings TRL cannot honour: the value it can, and why."""


@dataclass(frozen=True)
class Layout:
    """How our batch sizes become TRL's (the module docstring)."""

    per_device: int
    accumulation: int
    steps_per_generation: int
    max_steps: int


def layout(config: Any, processes: int = 1) -> Layout:
    """TRL's batch layout for ``config`` on ``processes`` processes; UsageError where the
    sizes do not divide."""
    episodes = config.tasks_per_step * config.group_size
    rows_per_step = config.micro_batch_size * processes
    if config.minibatch_size % rows_per_step or episodes % config.minibatch_size:
        raise UsageError(
            f"TRL needs minibatch_size ({config.minibatch_size}) to be a multiple of micro_batch_size × "
            f"processes ({rows_per_step}) and to divide the episodes of a step ({episodes} = "
            "tasks_per_step × group_size)"
        )
    accumulation = config.minibatch_size // rows_per_step
    steps_per_generation = episodes // rows_per_step
    optimizer_steps = episodes // config.minibatch_size * config.ppo_epochs
    return Layout(config.micro_batch_size, accumulation, steps_per_generation, config.steps * optimizer_steps)


def check_for_trl(config: Any, processes: int = 1) -> Layout:
    """Everything TRL cannot run as ``config`` says, refused before a model loads."""
    problems = [
        f"{name}: {getattr(config, name)!r} ({why}; TRL runs with {value!r})"
        for name, (value, why) in UNSUPPORTED.items()
        if getattr(config, name) != value
    ]
    if config.preset.regime != CLIPPED_RL:
        problems.append(
            f"algo {config.algo!r} trains in its own regime; TRL runs the clipped-ratio algorithms"
        )
    if config.loss_aggregation != "token-mean":
        problems.append(
            f"loss_aggregation {config.loss_aggregation!r}: TRL's token sum is token-mean only (set loss_aggregation=token-mean)"
        )
    if config.dual_clip and config.dual_clip < max(1 + (config.clip.eps_high or 0.2), config.bapo.high_max):
        problems.append(
            "dual_clip must be at least the highest ratio bound (TRL's delta caps the ratio itself)"
        )
    if problems:
        raise UsageError("this config cannot run on TRL:\n  " + "\n  ".join(problems))
    return layout(config, processes)


def grpo_args(config: Any, output_dir: str, processes: int | None = None, **overrides: Any) -> Any:
    """TRL's ``GRPOConfig`` for ``config`` (checked by :func:`check_for_trl`) on ``processes``
    processes (default: those ``accelerate launch`` or torchrun started, ``WORLD_SIZE``);
    ``overrides`` are TRL's own settings (logging, saving) laid over."""
    import torch
    from trl import GRPOConfig

    from agentgym.policies.dtypes import resolve_dtype

    shape = check_for_trl(config, processes or int(os.environ.get("WORLD_SIZE", "1")))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    values = dict(
        output_dir=output_dir,
        per_device_train_batch_size=shape.per_device,
        gradient_accumulation_steps=shape.accumulation,
        steps_per_generation=shape.steps_per_generation,
        num_generations=config.group_size,
        num_iterations=config.ppo_epochs,
        max_steps=shape.max_steps,
        learning_rate=config.rl_learning_rate or config.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        temperature=config.temperature,
        loss_type="dapo",  # a token sum: grpo.py normalises it as our learner does
        beta=config.kl_coef or 0.0,
        epsilon=config.clip.eps_low,
        delta=config.dual_clip or None,
        entropy_coef=0.0,  # ours is added in grpo.py, weighted as our learner weights it
        scale_rewards="none",  # TRL's advantages are replaced by ours
        seed=config.seed,
        bf16=resolve_dtype(config.dtype, device) == torch.bfloat16,
        gradient_checkpointing=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        remove_unused_columns=False,
        use_cpu=device.type == "cpu",
    )
    return GRPOConfig(**(values | overrides))


def trl_trainer(config: Any, url: str, train_tasks: list[str], args: Any) -> Any:
    """TRL's trainer of ``config``'s model and algorithm on the env server at ``url``."""
    from datasets import Dataset

    from agentgym.policies.adapters import adapt
    from agentgym.policies.dtypes import resolve_dtype
    from agentgym.policies.models import load_causal_lm
    from agentgym.trainers.trl_engine.episodes import EnvEpisodes
    from agentgym.trainers.trl_engine.grpo import AgentGymGRPOTrainer

    loaded = load_causal_lm(
        config.model, dtype=resolve_dtype(config.dtype, args.device), device=str(args.device)
    )
    if loaded.tokenizer.pad_token_id is None:
        loaded.tokenizer.pad_token = loaded.tokenizer.eos_token
    return AgentGymGRPOTrainer(
        config=config,
        episodes=EnvEpisodes(config, url, loaded.source),
        model=adapt(loaded.model, config),
        processing_class=loaded.tokenizer,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(train_tasks)}),
    )
