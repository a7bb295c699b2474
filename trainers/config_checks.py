"""The checks behind ``TrainConfig.validate()``: every problem at once, each a sentence the
CLI prints (exit code 2), before any model or server starts. The settings every run shares
are checked here; a training regime's own ones by its settings section (``problems``).
"""

from __future__ import annotations

import pkgutil
from typing import Any

from agentgym.agents import ACTION_ORDERS
from agentgym.policies.dtypes import AUTO, DTYPE_NAMES
from agentgym.trainers.loss_settings import AGGREGATIONS
from agentgym.trainers.presets import PRESETS
from agentgym.trainers.reporting import reporter_problems
from agentgym.trainers.schedules import schedule_of


def registry_problems(advantage: str, clip_rule: str) -> list[str]:
    """Whether ``advantage`` and ``clip_rule`` are registered. A name some preset uses is
    (a test holds it), so only another name loads the registry, and with it torch: a
    config is read and checked in a fraction of a second (``--print-config``)."""
    if advantage in {p.advantage for p in PRESETS.values()} and clip_rule in {
        p.clip_rule for p in PRESETS.values()
    }:
        return []
    from agentgym.trainers.algorithms import ADVANTAGE_ESTIMATORS, CLIP_RULES

    problems = []
    if advantage not in ADVANTAGE_ESTIMATORS:
        problems.append(f"advantage must be one of {', '.join(ADVANTAGE_ESTIMATORS)}")
    if clip_rule not in CLIP_RULES:
        problems.append(f"clip_rule must be one of {', '.join(CLIP_RULES)}")
    return problems


def config_problems(config: Any) -> list[str]:
    """Every problem with ``config``, each a sentence the CLI prints (exit code 2)."""
    problems = []
    problems += reporter_problems(config.report_to)
    if config.curriculum not in ("all", "fits-horizon", "unsolved"):
        problems.append("curriculum must be 'all', 'fits-horizon' or 'unsolved'")
    if config.generator not in ("hf", "vllm", "ray"):
        problems.append("generator must be 'hf', 'vllm' or 'ray'")
    if config.dtype != AUTO and config.dtype not in DTYPE_NAMES:
        problems.append(f"dtype must be {AUTO} or one of {', '.join(DTYPE_NAMES)}")
    if config.rl_optimizer not in ("fresh", "carried"):
        problems.append("rl_optimizer must be 'fresh' or 'carried'")
    if config.action_order not in ACTION_ORDERS:
        problems.append(f"action_order must be one of {', '.join(ACTION_ORDERS)}")
    if config.rl_learning_rate is not None and config.rl_learning_rate <= 0:
        problems.append("rl_learning_rate must be positive (or unset: learning_rate)")
    if config.loss_aggregation not in AGGREGATIONS:
        problems.append(f"loss_aggregation must be one of {', '.join(AGGREGATIONS)}")
    problems += registry_problems(config.advantage, config.clip_rule)
    try:
        schedule_of(config)
    except ValueError as exc:
        problems.append(str(exc))
    for name in ("max_refills", "keep_checkpoints"):
        if getattr(config, name) < 0:
            problems.append(f"{name} must be at least 0")
    if not 0 < config.clip.eps_low < 1 or config.clip.eps_high <= 0:
        problems.append("clip needs 0 < eps_low < 1 and eps_high > 0")
    if config.dual_clip and config.dual_clip <= 1:
        problems.append("dual_clip must be above 1 (or 0: off)")
    if config.steps < (0 if config.bc_steps else 1):  # steps 0: a cloning-only run
        problems.append("steps must be at least 1 (or 0 with bc_steps: behaviour cloning only)")
    for name in (
        "tasks_per_step",
        "group_size",
        "minibatch_size",
        "micro_batch_size",
        "max_turns",
    ):
        if getattr(config, name) < 1:
            problems.append(f"{name} must be at least 1")
    problems += _off_policy_problems(config)
    problems += _regime_problems(config)
    if config.pack_tokens is not None and config.pack_tokens < 2:
        problems.append("pack_tokens must be at least 2 (or null: no packing)")
    if not 0 <= config.bc_teacher_epsilon <= 1:
        problems.append("bc_teacher_epsilon must be in [0, 1] (0: the expert's own demonstrations)")
    if config.minibatch_size % config.micro_batch_size:
        problems.append("minibatch_size must be a multiple of micro_batch_size")
    return problems


def _off_policy_problems(config: Any) -> list[str]:
    problems = []
    if config.mode not in ("sync", "async"):
        problems.append("mode must be 'sync' or 'async'")
    if config.max_staleness < 0:
        problems.append("max_staleness must be at least 0")
    if config.mode == "async" and config.max_staleness < 1:
        problems.append("mode: async trains on one-step-old data; max_staleness must be at least 1")
    if not 0 <= config.replay_ratio < 1:
        problems.append("replay_ratio must be in [0, 1)")
    if config.replay_capacity < 1:
        problems.append("replay_capacity must be at least 1")
    if config.partial_rollout_tokens is not None and config.partial_rollout_tokens < 1:
        problems.append("partial_rollout_tokens must be at least 1 (or null: off)")
    if config.partial_rollout_tokens is not None and config.generator == "ray":
        problems.append(
            "partial_rollout_tokens needs generator hf or vllm (Ray workers do not pause episodes)"
        )
    return problems


def clipped_family_only(config: Any) -> list[str]:
    """A regime outside the clipped-ratio family: it learns from fresh samples of the current
    policy only, and has no advantages to shuffle."""
    off_policy = (
        config.mode == "async" or config.replay_ratio > 0 or config.partial_rollout_tokens is not None
    )
    problems = []
    if off_policy:
        problems.append(
            f"{config.algo} trains in mode: sync without replay or partial rollouts "
            "(async, replay_ratio and partial_rollout_tokens are for the clipped-ratio algorithms)"
        )
    if config.shuffle_advantages:
        problems.append(
            f"shuffle_advantages (the placebo) is for the clipped-ratio algorithms, not {config.algo}"
        )
    return problems


def _regime_problems(config: Any) -> list[str]:
    """The checks of the settings section the preset names (``critique_rl:``, ``agentevol:``)."""
    if config.preset.settings is None:
        return []
    return getattr(config, pkgutil.resolve_name(config.preset.settings).SECTION).problems(config)
