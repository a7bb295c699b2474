"""The ``agentgym`` command line: one Typer app whose commands live by product area."""

from __future__ import annotations

import logging
from importlib import metadata
from typing import Annotated

import typer

from agentgym.cli import fleet, models, play, project, train, view

app = typer.Typer(
    help="AgentGym: LLM agents in interactive text environments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
for area in (fleet, play, view, models, train, project):
    app.registered_commands += area.commands.registered_commands


def _print_version(asked: bool) -> None:
    if asked:
        typer.echo(f"agentgym {metadata.version('agentgym-platform')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """AgentGym: LLM agents in interactive text environments."""


EXAMPLES: dict[str, list[str]] = {
    "serve": [
        "agentgym serve textworld  # http://127.0.0.1:8101 (agentgym envs lists every env's port)",
        "agentgym serve math --port 9000 --set n_train=100 --max-sessions 16",
    ],
    "gateway": [
        "agentgym gateway --replica textworld=http://10.0.0.5:8101 --replica textworld=http://10.0.0.6:8101",
    ],
    "up": [
        "agentgym up textworld search  # textworld on :8101, search on :8103",
        "agentgym up textworld=3 --base-port 9100  # 3 replicas behind a gateway: http://127.0.0.1:9100/envs/textworld",
        "agentgym up textworld=3 --replica-ports 9101-9199  # the replicas on ports of your choice",
    ],
    "envs": ["agentgym envs", "agentgym envs --base-port 9100"],
    "check-env": ["agentgym check-env http://127.0.0.1:8101"],
    "generate": [
        "agentgym generate  # after adding an env or changing a hosting.toml",
        "agentgym generate --check",
    ],
    "new-env": ["agentgym new-env guess && agentgym generate && pytest envs/guess"],
    "eval": [
        "agentgym eval --env textworld --policy expert --n 8",
        "agentgym eval --env textworld --policy hf --model runs/<run> --n 4 --max-turns 3",
        "agentgym eval --env textworld --policy openai --base-url http://127.0.0.1:8200/v1 --model smollm2-135m "
        "--url http://127.0.0.1:8101",
        "agentgym eval --env textworld --policy openai --base-url http://127.0.0.1:8200/v1 --model smollm2-135m "
        "--tool-calls  # act through OpenAI tool calls",
    ],
    "collect": ["agentgym collect --env textworld --out data/textworld-expert.jsonl --n 32"],
    "view": [
        "agentgym view runs/<run>",
        "agentgym view runs/eval/<eval>/trajectories.jsonl --port 8301 --no-open",
    ],
    "export": [
        "agentgym export runs/<run> --out models/mine",
        "agentgym export runs/<run> --step 20 --out models/step-20",
    ],
    "export-trajectories": [
        "agentgym export-trajectories runs/<run> --out data/run  # data/run/trajectories.parquet",
        "agentgym export-trajectories runs/eval/<eval> --format hf --out data/eval  # datasets.load_from_disk",
    ],
    "serve-model": ["agentgym serve-model --model runs/<run> --port 8200"],
    "train": [
        "agentgym train --recipe grpo-choice  # a shipped recipe, ALGO-ENV (a wrong name lists them)",
        "agentgym train --algo bapo --env textworld --set steps=8 --set bapo.rho0=0.5 --out runs/mine",
        "agentgym train --recipe dapo-webshop --set group_size=8 --print-config  # what would run, documented",
        "agentgym train --resume --out runs/mine",
        "WANDB_MODE=offline agentgym train --recipe grpo-choice --report-to wandb  # also to a local W&B run",
    ],
    "plot": ["agentgym plot runs/<run>"],
}
"""Examples under each command's --help: what a newcomer copies first."""


def _add_examples(typer_app: typer.Typer) -> None:
    for command in typer_app.registered_commands:
        name = command.name or command.callback.__name__.replace("_", "-")
        if name in EXAMPLES:
            command.epilog = "Examples:\n\n" + "\n\n".join(EXAMPLES[name])


_add_examples(app)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()
