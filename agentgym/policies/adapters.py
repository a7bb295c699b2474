"""The parameters a run trains: LoRA adapters (peft) on a model, or all of its weights.

The trainer adapts its model with :func:`adapt`; loading a trained run as a model
(:mod:`agentgym.policies.runs`) rebuilds the same adapters from the run's saved settings.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class LoraSettings:
    """The run settings that shape the trained parameters, with their defaults (the
    trainer's config takes its defaults from here; an older run lacking a key gets it)."""

    lora: bool = True
    lora_rank: int = 16
    lora_alpha: int = 32
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    lora_layers: int | None = 8


LORA_DEFAULTS = LoraSettings()


def adapt(model: torch.nn.Module, config: Any) -> torch.nn.Module:
    """``model`` with its trainable parameters: LoRA adapters injected (in place), or all.
    ``config``: anything with :class:`LoraSettings`' fields (a ``TrainConfig``, or those settings)."""
    if not config.lora:
        return model.requires_grad_(True)
    from peft import LoraConfig, get_peft_model

    total = model.config.num_hidden_layers
    layers = None if config.lora_layers is None else list(range(max(0, total - config.lora_layers), total))
    lora = LoraConfig(
        r=config.lora_rank,
        lora_alpha=config.lora_alpha,
        lora_dropout=0.0,
        target_modules=list(config.lora_targets),
        layers_to_transform=layers,
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft probes transformers' deprecated ``is_gradient_checkpointing``; the FutureWarning
        # it triggers on every run is about peft's code, nothing a user can act on.
        warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated")
        return get_peft_model(model, lora)
