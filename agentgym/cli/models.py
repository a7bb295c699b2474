"""``agentgym export``, ``export-trajectories`` and ``serve-model``: a trained model and its episodes outside the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from agentgym.cli.common import EXIT_USAGE, check_model_loads, console, fail
from agentgym.policies.dtypes import check_dtype_name

commands = typer.Typer()


@commands.command("export")
def export_model(
    run: Annotated[Path, typer.Argument(help="A training run folder, or one of its checkpoints/step-N.")],
    out: Annotated[Path, typer.Option(help="The folder to write (new, or empty).")],
    step: Annotated[
        int | None,
        typer.Option(min=0, help="Export this step's checkpoint (default: the newest complete one)."),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="Weight type: bfloat16, float16 or float32 (default: the dtype the run trained "
            "and was evaluated in, so the folder plays as the run scored)."
        ),
    ] = None,
) -> None:
    """Save a training run's model as a standalone Hugging Face folder: trained weights
    merged into the base model (safetensors), tokenizer, config and a model card."""
    from agentgym.export import export_run

    try:
        with console.status(f"exporting {run} ..."):
            folder = export_run(run, out, step=step, dtype=dtype)
    except (ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    console.print(f"wrote {folder}; load it with AutoModelForCausalLM.from_pretrained({str(folder)!r})")


@commands.command("export-trajectories")
def export_trajectories(
    path: Annotated[
        Path,
        typer.Argument(help="A trajectory JSONL file (collect, eval) or a folder of them (eval out, a run)."),
    ],
    out: Annotated[Path, typer.Option(help="Folder to write.")],
    output_format: Annotated[
        str,
        typer.Option(
            "--format", help="parquet (OUT/trajectories.parquet) or hf (a datasets dataset: load_from_disk)."
        ),
    ] = "parquet",
) -> None:
    """Write trajectories as Parquet or a Hugging Face datasets dataset, one row per episode."""
    from agentgym.records.trajectory_table import export_trajectories as export

    try:
        written = export(path, out, output_format)
    except (ValueError, OSError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    console.print(f"wrote {written}")


@commands.command("serve-model")
def serve_model(
    model: Annotated[
        str | None,
        typer.Option(
            help="The local model to serve: alias, folder, training run (runs/<run> or its "
            "checkpoints/step-N) or Hugging Face id (default smollm2-135m)."
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes it to the network.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port.")] = 8200,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda when available).")] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            help="bfloat16, float16 or float32 (default: a trained model's own dtype, else "
            "bf16 on GPU and fp32 on CPU)."
        ),
    ] = None,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Requests decoded together at most.")] = 8,
    served_model_name: Annotated[str | None, typer.Option(help="The name /v1/models reports.")] = None,
    api_key: Annotated[
        str | None, typer.Option(help="Require this bearer token (do set one when --host is not loopback).")
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="Longest reply a request may ask for (default: the context its prompt leaves)."
        ),
    ] = None,
    shutdown_grace: Annotated[
        float,
        typer.Option(min=0, help="On SIGTERM or Ctrl-C, seconds requests still generating get to finish."),
    ] = 10.0,
) -> None:
    """Serve a local model or a training run over OpenAI's chat-completions API
    (/v1/chat/completions, /v1/models); `eval --policy openai --base-url` plays it."""
    from agentgym.policies.models import DEFAULT_MODEL
    from agentgym.policies.openai_server import serve_model as serve

    check_model_loads("hf", model)
    try:
        check_dtype_name(dtype or "auto")
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    serve(
        model or DEFAULT_MODEL,
        host=host,
        port=port,
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        served_model_name=served_model_name,
        api_key=api_key,
        max_tokens=max_tokens,
        shutdown_grace_s=shutdown_grace,
    )
