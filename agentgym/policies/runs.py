"""Training runs as models: a run folder (its newest complete checkpoint, or ``step``) or
one of its ``checkpoints/step-N`` folders loads as the run's base model (``model`` in its
``config.yaml``, with that model's tokenizer) plus the checkpoint's trained weights: LoRA
adapters rebuilt from the run's LoRA settings and merged in, or every weight for a run
that trained all of them. The result is a plain ``transformers`` model, as fast as the
base model; ``agentgym export`` saves it as a standalone Hugging Face folder.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from agentgym.policies.adapters import LoraSettings, adapt
from agentgym.records.run_folder import (
    CHECKPOINTS,
    PLAY_FILE,
    RunDir,
    checkpoint_problem,
    load_trainable,
    read_json_object,
)

RUN_CONFIG = "config.yaml"
LORA_FIELDS = tuple(field.name for field in fields(LoraSettings))
"""The run settings that shape the trained parameters (:func:`~agentgym.policies.adapters.adapt`)."""


@dataclass(frozen=True)
class RunCheckpoint:
    run: Path
    """The run folder (``config.yaml``, ``metrics.jsonl``, ``checkpoints/``)."""
    folder: Path
    """The complete checkpoint folder (``checkpoints/step-N``)."""
    step: int
    config: dict[str, Any]
    """The run's resolved config, as saved."""

    @property
    def base_model(self) -> str:
        """The model the run trained: an alias, hub id or folder (relative to where the run
        was started, like every path in the config)."""
        return str(self.config["model"])


def is_run(path: Path) -> bool:
    """A training run folder: a ``config.yaml`` where a model folder has ``config.json``."""
    return (path / RUN_CONFIG).is_file() and not (path / "config.json").is_file()


def run_of(spec: str | Path | None) -> Path | None:
    """The training run ``spec`` names (a run folder or one of its ``checkpoints/step-N``);
    None for anything else."""
    if spec is None:
        return None
    path = Path(spec).expanduser()
    if is_run(path):
        return path
    if path.is_dir() and path.parent.name == CHECKPOINTS and is_run(path.parent.parent):
        return path.parent.parent
    return None


def record_folder(spec: str | Path | None) -> Path | None:
    """Where the training run or exported model ``spec`` keeps its play record (its run
    folder, or the exported folder); None for a hub id or alias."""
    return run_of(spec) or (Path(spec) if spec is not None and Path(spec).is_dir() else None)


def trained_dtype(spec: str | Path | None) -> str | None:
    """The dtype the run or exported model ``spec`` trained in, from its play record; None
    for any other model and for records from before the dtype was kept."""
    folder = record_folder(spec)
    record = read_json_object(folder / PLAY_FILE) if folder is not None else None
    dtype = record.get("dtype") if record is not None else None
    return dtype if isinstance(dtype, str) else None


def find_checkpoint(spec: str | Path, step: int | None = None) -> RunCheckpoint | None:
    """The checkpoint ``spec`` names: a run folder's newest complete one (or ``step``'s), or
    a ``checkpoints/step-N`` folder of a run. None when ``spec`` is neither; ValueError for
    a run without a complete checkpoint (or without ``step``), or a torn checkpoint."""
    run_path = run_of(spec)
    if run_path is None:
        return None
    path = Path(spec).expanduser()
    run = RunDir(run_path, create=False)
    if path == run_path:
        folder = run.checkpoint_at(step) if step is not None else run.latest_checkpoint()
        if folder is None:
            raise ValueError(f"{path} is a training run with no complete checkpoint yet")
    else:  # one of the run's checkpoints/step-N
        if step is not None:
            raise ValueError(f"{path} is one checkpoint already: give its run folder to pick a step")
        if problem := checkpoint_problem(path):
            raise ValueError(f"checkpoint {path} is not complete: {problem}")
        folder = path
    config = yaml.safe_load((run.path / RUN_CONFIG).read_text()) or {}
    if not isinstance(config, dict) or "model" not in config:
        raise ValueError(f"{run.path / RUN_CONFIG} does not name the run's model")
    state = json.loads((folder / "state.json").read_text())
    return RunCheckpoint(run.path, folder, int(state["step"]), config)


def merge_trained_weights(model: Any, checkpoint: RunCheckpoint) -> Any:
    """``model`` (the run's base model, loaded) with the checkpoint's trained weights: LoRA
    adapters rebuilt from the run's settings and merged in, or every weight; in eval mode.
    ValueError when the checkpoint does not fit the model."""
    settings = lora_settings(checkpoint.config)
    model = adapt(model, settings)
    trained = load_trainable(checkpoint.folder)
    expected = {name for name, p in model.named_parameters() if p.requires_grad}
    if set(trained) != expected:
        unknown, missing = sorted(set(trained) - expected), sorted(expected - set(trained))
        raise ValueError(
            f"checkpoint {checkpoint.folder} does not fit {checkpoint.base_model} with the run's "
            f"LoRA settings: unknown {unknown[:3]}, missing {missing[:3]}"
        )
    model.load_state_dict(trained, strict=False)
    if settings.lora:
        model = model.merge_and_unload()
    return model.eval()


def lora_settings(config: dict[str, Any]) -> LoraSettings:
    """The run's LoRA settings; the defaults for keys an older run lacks."""
    return LoraSettings(**{name: config[name] for name in LORA_FIELDS if name in config})
