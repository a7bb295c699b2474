"""``agentgym train`` and ``agentgym plot``."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer
import yaml

from agentgym.trainers.presets import algo_help
from agentgym.trainers.schedules import SCHEDULES

if TYPE_CHECKING:
    from agentgym.trainers.config import TrainConfig

from agentgym.cli.common import console, fail, interrupted, parse_settings, require_env

commands = typer.Typer()


@commands.command()
def train(
    algo: Annotated[str | None, typer.Option(help=algo_help())] = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            help=f"{' | '.join(SCHEDULES)} (scaling-inter: ScalingInter-RL's horizon, the default)."
        ),
    ] = None,
    env: Annotated[str | None, typer.Option(help="Environment (default: textworld).")] = None,
    model: Annotated[str | None, typer.Option(help="Model alias, Hugging Face id or folder.")] = None,
    recipe: Annotated[
        str | None,
        typer.Option(help="A shipped recipe, ALGO-ENV (e.g. grpo-webshop); a wrong name lists them all."),
    ] = None,
    config: Annotated[Path | None, typer.Option(help="YAML file of TrainConfig fields.")] = None,
    settings: Annotated[
        list[str], typer.Option("--set", help="Override a field, KEY=VALUE (YAML value; dotted for nested).")
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    out: Annotated[Path | None, typer.Option(help="Run folder (default runs/<algo>-<env>-<time>).")] = None,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue the run in --out (that folder, wherever it was started) from its newest complete checkpoint."
        ),
    ] = False,
    print_config: Annotated[
        bool,
        typer.Option(
            "--print-config", help="Print the resolved config as YAML, each field with its doc, and exit."
        ),
    ] = False,
    nproc: Annotated[
        int,
        typer.Option(min=1, help="Data-parallel processes (torch.distributed: gloo on CPU, nccl on GPU)."),
    ] = 1,
    engine: Annotated[
        str,
        typer.Option(
            help="ours (the default) | trl: TRL's GRPOTrainer (under accelerate with --nproc) with our "
            "envs and algorithm, writing the same run folder (docs/trl.md)."
        ),
    ] = "ours",
    report_to: Annotated[
        list[str],
        typer.Option(
            "--report-to",
            help="Metrics also go to: tensorboard (the default), wandb (Weights & Biases; offline "
            "with WANDB_MODE=offline), none. Repeat for several (sets report_to).",
        ),
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
) -> None:
    """Train a policy with multi-turn RL on rollouts from env servers."""
    from agentgym import registry
    from agentgym.policies.models import ModelNotAvailable, check_model
    from agentgym.trainers.config_files import commented_yaml

    if resume and out is None:
        raise fail("--resume needs --out RUN_DIR", 2)
    if engine not in ENGINES:
        raise fail(f"--engine must be one of {', '.join(ENGINES)}, not {engine!r}", 2)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and out is None:  # started by torchrun on several nodes
        raise fail("several processes need one run folder: --out RUN_DIR, on a filesystem every node sees", 2)
    try:
        overrides = parse_settings(settings) | _reporters(report_to)
        layers = ConfigLayers(
            recipe, config, {"algo": algo, "schedule": schedule, "env": env, "model": model}
        )
        resolved = _resolve_config(layers, overrides, out, resume)
    except (ValueError, FileNotFoundError, yaml.YAMLError) as exc:
        raise fail(str(exc), 2) from None
    if print_config:  # before anything is checked or created: it only shows what would run
        typer.echo(commented_yaml(resolved), nl=False)
        return
    run_dir = Path(resolved.output_dir)
    if engine == "trl":
        _check_for_trl(resolved, nproc)
    rank = int(os.environ.get("RANK", "0"))  # set by torchrun in each data-parallel process
    if resume and rank == 0:  # before any model loads; a refused resume changes nothing
        from agentgym.records.run_folder import RunDir

        try:
            RunDir(run_dir, create=False).resume_checkpoint()
        except ValueError as exc:
            raise fail(str(exc), 2) from None
    require_env(resolved.env, resolved.env_url)
    try:  # the local server's settings; a running server (env_url) has its own
        registry.check_settings(resolved.env, [] if resolved.env_url else resolved.env_settings)
    except ValueError as exc:
        raise fail(f"env_settings: {exc}", 2) from None
    try:  # within seconds, before the run folder or any server exists
        check_model(resolved.model)
    except ModelNotAvailable as exc:
        raise fail(str(exc), 2) from None
    if not resume and rank == 0 and (run_dir / "metrics.jsonl").exists():
        raise fail(f"{run_dir} already holds a run: continue it with --resume, or pick another --out", 2)
    if rank == 0:
        console.print(
            f"run folder: {run_dir}  ({resolved.algo}, {resolved.schedule} schedule, {resolved.env})"
        )
    if engine == "trl":
        _train_on_trl(resolved, run_dir, nproc, resume)
        return
    if nproc > 1 and "WORLD_SIZE" not in os.environ:
        _launch_data_parallel(nproc, resolved, run_dir, resume)
        return
    from agentgym.trainers.loop import SetupError, Trainer
    from agentgym.trainers.manifest import MANIFEST_FILE

    started = time.perf_counter()
    try:
        Trainer(resolved, run_dir, resume=resume).run()
    except SetupError as exc:
        raise fail(str(exc), 2) from None
    except KeyboardInterrupt:
        raise interrupted(_what_a_resume_keeps(run_dir), {"--out": str(run_dir), "--resume": None}) from None
    if rank != 0:
        return
    manifest = run_dir / MANIFEST_FILE  # what the held-out figures came from
    console.print(
        f"done in {time.perf_counter() - started:.0f}s: metrics {run_dir / 'metrics.jsonl'}, "
        f"checkpoints {run_dir / 'checkpoints'}, {_plot(run_dir)}"
        + (f", manifest {manifest}" if manifest.exists() else "")
    )


ENGINES = ("ours", "trl")
"""What ``--engine`` takes: our trainer, or TRL's ``GRPOTrainer`` with our plug-ins."""


def _check_for_trl(config: TrainConfig, nproc: int) -> None:
    """Refuse what TRL cannot run, before any model loads (exit 2)."""
    from agentgym.contract.errors import UsageError

    try:
        from agentgym.trainers.trl_engine.build import check_for_trl

        check_for_trl(config, nproc)
    except ModuleNotFoundError as exc:
        raise fail(
            f"--engine trl needs TRL ({exc.name} is not installed): pip install 'agentgym[trl]'", 2
        ) from None
    except UsageError as exc:
        raise fail(str(exc), 2) from None


def _train_on_trl(config: TrainConfig, run_dir: Path, nproc: int, resume: bool) -> None:
    """Train on TRL: in this process, or ``nproc`` under ``accelerate launch``."""
    from agentgym.trainers.trl_engine.run import launch_command, train_on_trl

    started = time.perf_counter()
    try:
        if nproc > 1:
            run_dir.mkdir(parents=True, exist_ok=True)
            config.save(run_dir / "config.yaml")
            if code := subprocess.call(launch_command(nproc, run_dir, resume)):
                raise fail(f"training on TRL failed (exit code {code}); see the messages above", 1)
        else:
            train_on_trl(config, run_dir, resume)
    except KeyboardInterrupt:
        raise interrupted(_what_a_resume_keeps(run_dir), {"--out": str(run_dir), "--resume": None}) from None
    console.print(
        f"done in {time.perf_counter() - started:.0f}s on TRL: metrics {run_dir / 'metrics.jsonl'}, {_plot(run_dir)}"
    )


def _what_a_resume_keeps(run_dir: Path) -> str:
    from agentgym.records.run_folder import RunDir

    newest = RunDir(run_dir, create=False).latest_checkpoint()
    if newest is None:
        return f"no step was checkpointed yet in {run_dir}"
    return f"the newest complete checkpoint is {newest} (later steps are trained again)"


def _plot(run_dir: Path) -> str:
    """Draw the run's curves; a machine without matplotlib (the ``train`` extra) still ends
    the run cleanly, with the command that draws them later."""
    from agentgym.trainers.plot import plot_run

    try:
        return f"plot {plot_run(run_dir)}"
    except ModuleNotFoundError as exc:
        return f"no plot ({exc.name} is not installed; then: agentgym plot {run_dir})"


def _launch_data_parallel(nproc: int, config: TrainConfig, run_dir: Path, resume: bool) -> None:
    """Run ``nproc`` trainers under torchrun. They all read the config saved in the run folder
    (``train --resume`` on a folder that has trained no step starts at step 1), so every rank
    trains with exactly the resolved config, whatever flags or files produced it."""
    from agentgym.trainers.distributed import launch_command

    if not resume:
        run_dir.mkdir(parents=True, exist_ok=True)
        config.save(run_dir / "config.yaml")
    code = subprocess.call(launch_command(nproc, ["train", "--resume", "--out", str(run_dir)]))
    if code:
        raise fail(f"data-parallel training failed (exit code {code}); see the messages above", 1)


def _reporters(names: list[str]) -> dict[str, Any]:
    """``--report-to`` as a config override (``none`` alone: no reporter)."""
    if not names:
        return {}
    return {"report_to": [] if names == ["none"] else names}


class ConfigLayers(NamedTuple):
    """Where a run's config comes from, before ``--set``: a shipped recipe, a YAML file and
    the flags (None: not given)."""

    recipe: str | None
    config_file: Path | None
    flags: dict[str, str | None]


def _resolve_config(
    layers: ConfigLayers, overrides: dict[str, Any], out: Path | None, resume: bool
) -> TrainConfig:
    """defaults < the env's layer < --recipe < --config < flags < --set; on --resume, the
    config saved in ``out``, which stays the run folder (as an absolute path: the saved
    ``output_dir`` may be relative to another directory, or name where the run was moved from)."""
    from agentgym.trainers.config_files import default_run_folder, layered_config, recipe, saved_config

    if resume:
        return saved_config(Path(out))
    values = recipe(layers.recipe) if layers.recipe else {}
    if layers.config_file:
        values |= yaml.safe_load(layers.config_file.read_text()) or {}
    flags = {key: value for key, value in layers.flags.items() if value}
    resolved = layered_config(values, flags | overrides)
    return resolved.with_overrides({"output_dir": str(out or default_run_folder(resolved))})


@commands.command()
def plot(
    run_dir: Annotated[Path, typer.Argument(help="A run folder with metrics.jsonl.")],
    x: Annotated[
        str,
        typer.Option(
            help="What the x axis counts: step, samples (episodes played), tokens (sampled), wall (minutes)."
        ),
    ] = "step",
    out: Annotated[Path | None, typer.Option(help="The PNG to write (default RUN_DIR/curves.png).")] = None,
) -> None:
    """Draw a run's training curves to RUN_DIR/curves.png."""
    from agentgym.trainers.plot import plot_run

    try:
        console.print(f"wrote {plot_run(run_dir, out, x=x)}")
    except (FileNotFoundError, ValueError) as exc:
        raise fail(str(exc), 2) from None
