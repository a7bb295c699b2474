"""``agentgym export``: a training run's model as a standalone Hugging Face folder.

The folder holds the base model with the checkpoint's trained weights merged in
(``model.safetensors``), its config and generation config, the tokenizer, and a model card
(``README.md``) with the run's config and held-out figures, so plain
``AutoModelForCausalLM.from_pretrained(folder)`` loads it, as do vLLM and the hub. It is
written to a temporary folder beside ``out`` and renamed into place, so ``out`` exists
only complete.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from agentgym.play.play_profile import PlayProfile, read_play, write_play
from agentgym.policies.chat import stop_token_ids
from agentgym.policies.dtypes import AUTO, check_dtype_name, export_dtype
from agentgym.policies.runs import RUN_CONFIG, RunCheckpoint, find_checkpoint
from agentgym.records.run_folder import READABLE_FILE, READABLE_FOLDER, MetricsLog

HELD_OUT_PREFIX = ("val_", "eval_")
"""Metrics of the held-out evaluations: validation (``val_success_rate``, ...) and the
test panel of the before/after report (``eval_success_rate``, ...)."""


def export_run(
    run: str | Path, out: str | Path, *, step: int | None = None, dtype: str | None = None
) -> Path:
    """Export ``run`` (a run folder, its newest complete checkpoint or ``step``'s; or one
    checkpoint folder) to the new folder ``out``, weights in ``dtype`` (None: the dtype the
    run trained in, :func:`~agentgym.policies.dtypes.export_dtype`). ValueError when ``run``
    is not a training run, ``out`` exists and is not empty, or ``dtype`` is unknown."""
    import torch

    from agentgym.policies.models import load_checkpoint

    check_dtype_name(dtype or AUTO)

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"{out} exists and is not an empty folder: pick a new --out")
    checkpoint = find_checkpoint(run, step)
    if checkpoint is None:
        raise ValueError(
            f"{run} is not a training run folder (config.yaml and checkpoints/) nor one of its checkpoints"
        )
    played = read_play(checkpoint.run)
    trained = played.dtype if played else None
    written_dtype = export_dtype(dtype, trained)
    loaded = load_checkpoint(checkpoint, spec=str(run))
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        stop_where_the_run_stopped(loaded.model.generation_config, loaded.tokenizer, played)
        loaded.model.to(getattr(torch, written_dtype)).save_pretrained(staging, safe_serialization=True)
        loaded.tokenizer.save_pretrained(staging)
        card = model_card(checkpoint, loaded.source.describe(), written_dtype, trained)
        (staging / "README.md").write_text(card)
        if played is not None:  # eval --model plays it as the run did, in the run's dtype
            write_play(staging, played)
        for written in staging.iterdir():  # transformers writes some files private (0600)
            written.chmod(READABLE_FILE)
        staging.chmod(READABLE_FOLDER)  # mkdtemp makes it private
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def stop_where_the_run_stopped(generation: Any, tokenizer: Any, played: PlayProfile | None) -> None:
    """The generation config a plain ``generate`` reads: it stops on every token that ended a
    reply in the run (the end of turn as well as the eos) and, where the run recorded it,
    after the run's reply length, greedy as its held-out evaluation played."""
    generation.eos_token_id = sorted(stop_token_ids(tokenizer, generation))
    if played and played.max_new_tokens:
        generation.max_new_tokens = played.max_new_tokens
    if played and played.temperature == 0:
        generation.do_sample, generation.temperature, generation.top_p, generation.top_k = (
            False,
            None,
            None,
            None,
        )


def weights_note(dtype: str, trained: str | None) -> str:
    """What the weights' dtype means for playing the model as the run scored it."""
    if trained is None:
        return "lossless (the run did not record its dtype)" if dtype == "float32" else "rounded"
    if dtype == trained:
        return "the dtype the run trained and was evaluated in"
    return (
        f"rounded from the run's {trained} (`agentgym eval --model <this folder>` computes in "
        f"{trained}; `agentgym export --dtype {trained}` keeps the weights exactly)"
    )


def model_card(checkpoint: RunCheckpoint, source: dict[str, Any], dtype: str, trained: str | None) -> str:
    """A Hugging Face model card: front matter, where the model came from, its held-out
    figures and the run's config."""
    config = checkpoint.config
    front: dict[str, Any] = {
        "library_name": "transformers",
        "tags": ["agentgym", str(config.get("algo", "")), str(config.get("env", ""))],
    }
    base = checkpoint.base_model
    if "/" in base and not Path(base).exists():  # the hub's field takes hub ids only
        front["base_model"] = base
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).strip(),
        "---",
        "",
        f"# {checkpoint.run.name}, step {checkpoint.step}",
        "",
        f"Trained with AgentGym (`agentgym train --algo {config.get('algo')}`) on the "
        f"`{config.get('env')}` environment from `{checkpoint.base_model}`"
        f"{' (LoRA adapters, merged)' if config.get('lora', True) else ''}.",
        "",
        f"- run folder: `{checkpoint.run}`",
        f"- checkpoint: `{checkpoint.folder.name}` (step {checkpoint.step})",
        f"- sha256 of the base model and checkpoint files: `{source['sha256']}`",
        f"- weights: {dtype}, {weights_note(dtype, trained)}",
        "",
        "```python",
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        'model = AutoModelForCausalLM.from_pretrained("<this folder>")',
        'tokenizer = AutoTokenizer.from_pretrained("<this folder>")',
        "```",
        "",
        "Evaluate it on the environment's test split with "
        f"`agentgym eval --env {config.get('env')} --model <this folder>`.",
        "",
        *held_out_section(checkpoint),
        "## Training config",
        "",
        "```yaml",
        (checkpoint.run / RUN_CONFIG).read_text().strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def held_out_section(checkpoint: RunCheckpoint) -> list[str]:
    """The held-out evaluations of the run (``val_*``, ``eval_*`` numbers in ``metrics.jsonl``), one
    row per evaluated step; the exported step is marked."""
    records = MetricsLog(checkpoint.run / "metrics.jsonl").read()
    rows = [r for r in records if any(k.startswith(HELD_OUT_PREFIX) for k in r)]
    if not rows:
        return ["## Held-out results", "", "The run logged no held-out evaluation.", ""]
    names = sorted({k for r in rows for k, v in r.items() if k.startswith(HELD_OUT_PREFIX) and _number(v)})
    lines = [
        "## Held-out results",
        "",
        "Greedy episodes as the trainer measured them: `val_*` on the first validation tasks "
        "(what chose the best checkpoint), `eval_*` on the first test tasks (before and after training).",
        "",
        "| step | phase | " + " | ".join(names) + " |",
        "| --- | --- | " + " | ".join("---" for _ in names) + " |",
    ]
    for record in rows:
        mark = " (exported)" if record.get("step") == checkpoint.step else ""
        cells = [_cell(record.get(name)) for name in names]
        lines.append(
            f"| {record.get('step')}{mark} | {record.get('phase', '')} | " + " | ".join(cells) + " |"
        )
    return [*lines, ""]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    return f"{value:.3f}" if _number(value) else ""
