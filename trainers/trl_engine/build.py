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

import copy
import functools
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
    per_round: int
    """Optimizer steps a generation round (one of our steps) takes."""
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
    per_round = episodes // config.minibatch_size * config.ppo_epochs
    return Layout(
        config.micro_batch_size, accumulation, steps_per_generation, per_round, config.steps * per_round
    )


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
    from agentgym.trainers.trl_engine.episodes import EnvEpisodes
    from agentgym.trainers.trl_engine.grpo import AgentGymGRPOTrainer

    loaded = load_for_trl(config, args)
    return AgentGymGRPOTrainer(
        config=config,
        episodes=EnvEpisodes(config, url, loaded.source),
        model=adapt(loaded.model, config),
        processing_class=loaded.tokenizer,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": list(train_tasks)}),
    )


def load_for_trl(config: Any, args: Any) -> Any:
    """``config``'s model on TRL's device, in the run's dtype, with a pad token (TRL pads)."""
    from agentgym.policies.dtypes import resolve_dtype
    from agentgym.policies.models import load_causal_lm

    loaded = load_causal_lm(
        config.model, dtype=resolve_dtype(config.dtype, args.device), device=str(args.device)
    )
    if loaded.tokenizer.pad_token_id is None:
        loaded.tokenizer.pad_token = loaded.tokenizer.eos_token
    return loaded


TOOLS_ADVANTAGES = {"grpo": "group", "grpo-unscaled": "none"}
"""Our advantage estimators TRL's own update computes (its ``scale_rewards``)."""


class RoundHorizon:
    """The turn limit of TRL's current generation round: our schedule's at that step
    (:func:`~.episodes.rl_step`); read by each :class:`~.tools.EnvSession` at ``reset``."""

    def __init__(self, config: Any) -> None:
        from agentgym.trainers.schedules import schedule_of

        self.schedule = schedule_of(config)
        self.trainer: Any = None
        """Set once TRL's trainer exists (it probes the factory while it is being built)."""

    def __call__(self) -> int:
        from agentgym.trainers.trl_engine.episodes import rl_step

        return self.schedule.horizon_at(rl_step(self.trainer))


def check_for_tools(config: Any, tokenizer: Any) -> None:
    """What the ``environment_factory`` path cannot run, refused before a model loads: TRL
    generates and scores there with its own code, so the update is TRL's GRPO (our BAPO
    bounds, per-turn advantages and constrained decoding need ``rollout_func``); the model's
    chat template must render tool calls, which TRL parses."""
    from trl.chat_template_utils import supports_tool_calling

    problems = []
    if config.clip_rule != "fixed":
        problems.append(
            f"algo {config.algo!r}: its {config.clip_rule} clip rule runs on the rollout_func path only"
        )
    if config.advantage not in TOOLS_ADVANTAGES:
        problems.append(
            f"advantage {config.advantage!r}: TRL's own update computes {sorted(TOOLS_ADVANTAGES)} only"
        )
    if config.constrain_actions:
        problems.append("constrain_actions: TRL's generation draws from the whole vocabulary")
    if not supports_tool_calling(tokenizer):
        problems.append(
            f"model {config.model!r}: its chat template cannot render tool calls (a user turn, an "
            "assistant tool call, a tool reply); use a tool-calling model, or the rollout_func path"
        )
    if problems:
        raise UsageError("this config cannot run on TRL's environment_factory:\n  " + "\n  ".join(problems))


def tools_trainer(config: Any, url: str, train_tasks: list[str], args: Any, token: str | None = None) -> Any:
    """TRL's own ``GRPOTrainer`` with the env server at ``url`` as its ``environment_factory``
    (:class:`~.tools.EnvSession`, one per rollout), for models that call tools. Everything
    is checked (:func:`check_for_tools`, the layout in ``args``) before the model loads."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    from agentgym.policies.adapters import adapt
    from agentgym.policies.models import resolve_model
    from agentgym.trainers.trl_engine.tools import INSTRUCTION, EnvSession

    check_for_tools(config, AutoTokenizer.from_pretrained(resolve_model(config.model)))
    horizon = RoundHorizon(config)
    args = copy.copy(args)  # not dataclasses.replace: TRL's checks refuse a second __post_init__
    args.scale_rewards = TOOLS_ADVANTAGES[config.advantage]
    args.epsilon_high = config.clip.eps_high or config.clip.eps_low
    args.max_tool_calling_iterations = config.longest_horizon
    loaded = load_for_trl(config, args)
    rows = {
        "prompt": [[{"role": "user", "content": INSTRUCTION}]] * len(train_tasks),
        "task_id": list(train_tasks),
    }
    trainer = GRPOTrainer(
        model=adapt(loaded.model, config),
        processing_class=loaded.tokenizer,
        args=args,
        reward_funcs=[],
        train_dataset=Dataset.from_dict(rows),
        environment_factory=functools.partial(
            EnvSession, url, horizon, token=token, action_order=config.action_order
        ),
    )
    horizon.trainer = trainer
    return trainer
