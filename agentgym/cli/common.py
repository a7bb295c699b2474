"""What every ``agentgym`` command shares: consoles, failing with an exit code, ``--set``
pairs, the options several commands take, serving on a bound socket."""

from __future__ import annotations

import contextlib
import shlex
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.rich_utils
import yaml
from rich.markup import escape

from agentgym import registry
from agentgym.contract.errors import AgentGymError
from agentgym.progress import make_console, output_width

console = make_console()
err_console = make_console(stderr=True)
if typer.rich_utils.MAX_WIDTH is None:  # --help: typer's own console, 80 columns when piped
    typer.rich_utils.MAX_WIDTH = output_width(sys.stdout)

EXIT_USAGE = 2


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print ``message`` as an error and return the exit to raise. One unbroken line (a
    path or command in it stays copyable, whatever the width) and no markup read in it (a
    path may hold brackets)."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
    return typer.Exit(code)


EXIT_INTERRUPTED = 130
"""A Ctrl-C's exit code (128 + SIGINT), as a shell reports one."""


def interrupted(saved: str, needed: dict[str, str | None]) -> typer.Exit:
    """After a Ctrl-C: print what is ``saved`` and the command that resumes (this command
    line plus the options of ``needed`` it lacks: ``{"--out": path, "--resume": None}``,
    None for a flag), and return the exit to raise."""
    command = ["agentgym", *sys.argv[1:]]
    for option, value in needed.items():
        if not any(arg == option or arg.startswith(f"{option}=") for arg in command):
            command += [option] if value is None else [option, value]
    err_console.print(f"interrupted: {saved}. Resume with: {shlex.join(command)}", soft_wrap=True)
    return typer.Exit(EXIT_INTERRUPTED)


def count_lines(path: Path) -> int:
    """Complete lines in ``path`` (a JSONL file a crash may have torn); 0 when it is missing."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def parse_settings(pairs: list[str]) -> dict[str, Any]:
    """``["n_test=10", "challenges=[tw-simple]"]`` -> ``{"n_test": 10, "challenges": ["tw-simple"]}``."""
    settings: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise fail(f"--set expects KEY=VALUE, got {pair!r}", EXIT_USAGE)
        settings[key.strip()] = yaml.safe_load(value)
    return settings


FdOpt = Annotated[
    int | None, typer.Option(hidden=True, help="A listening socket inherited from the launcher (internal).")
]


def listening_socket(host: str, port: int, fd: int | None, what: str) -> socket.socket:
    """The socket a server command serves on: the one its launcher bound and handed down
    (``--fd``), else one bound now, before anything is announced; a taken port exits 1."""
    from agentgym.servers.launcher import PortInUse, bind_listener

    if fd is not None:
        return socket.socket(fileno=fd)
    try:
        return bind_listener(host, port, what)
    except PortInUse as exc:
        raise fail(f"{exc}; stop what holds it, or pick another --port") from None


def run_uvicorn(application: Any, sock: socket.socket, host: str, port: int, log_level: str) -> None:
    """Serve ``application`` on the already bound ``sock`` (``host``/``port`` only label the log)."""
    import uvicorn

    from agentgym.servers.launcher import HTTP_PROTOCOL, KEEP_ALIVE_S

    config = uvicorn.Config(
        application,
        host=host,
        port=port,
        log_level=log_level,
        timeout_keep_alive=KEEP_ALIVE_S,
        http=HTTP_PROTOCOL,
    )
    with contextlib.suppress(KeyboardInterrupt):  # uvicorn re-raises the Ctrl-C it handled; exit 0
        uvicorn.Server(config).run(sockets=[sock])


def require_env(name: str, url: str | None = None) -> None:
    """Exit 2 unless ``name`` is a registered env. An OpenEnv server (``url`` a ws:// URL) or
    an MCP server (a URL ending in /mcp) may serve an env of its own: its name is checked
    against the server's instead."""
    from agentgym.clients.mcp_client import is_mcp_url
    from agentgym.clients.openenv_client import is_openenv_url

    if url is not None and (is_openenv_url(url) or is_mcp_url(url)):
        return
    try:
        registry.resolve(name)
    except AgentGymError as exc:
        raise fail(exc.message, EXIT_USAGE) from None


PolicyOpt = Annotated[str, typer.Option(help="Policy backend: hf, openai, vllm or expert.")]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        help="Model: alias, folder, training run (runs/<run> or its checkpoints/step-N) or Hugging Face "
        "id (hf/vllm; default smollm2-135m), or the openai model name."
    ),
]
BaseUrlOpt = Annotated[
    str | None, typer.Option(help="OpenAI-compatible API root, e.g. http://127.0.0.1:8200/v1.")
]
ApiKeyOpt = Annotated[str | None, typer.Option(envvar="OPENAI_API_KEY", help="API key for --policy openai.")]
EnvUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Env server URL (default: start a local server for ENV, stop it after); "
        "ws://HOST:PORT: an OpenEnv server (docs/openenv.md); http://HOST:PORT/.../mcp: an MCP "
        "server (docs/mcp.md).",
    ),
]
TokenOpt = Annotated[
    str | None, typer.Option(envvar="AGENTGYM_TOKEN", help="Bearer token of the env server.")
]
TasksOpt = Annotated[
    int | None, typer.Option("--n", min=1, help="Use the first N tasks of the split (default: all).")
]
MaxTurnsOpt = Annotated[
    int | None, typer.Option(min=1, help="Agent turns per episode (default: the env's max_turns).")
]
ConcurrencyOpt = Annotated[int, typer.Option(min=1, help="Episodes in flight at once.")]
ToolCallsOpt = Annotated[
    bool,
    typer.Option(
        "--tool-calls",
        help="--policy openai acts through OpenAI tool calls (tools=, one function per action type "
        "of the commands the env lists) instead of writing the reply format.",
    ),
]
TemperatureOpt = Annotated[
    float | None, typer.Option(min=0.0, help="Sampling temperature (default: 0 if k=1, else 1).")
]
MaxNewTokensOpt = Annotated[int | None, typer.Option(min=1, help="Generated tokens per reply at most.")]
HistoryOpt = Annotated[
    int | None, typer.Option(min=0, help="Text backends see only the last N turns (default: all).")
]


ShowActionsOpt = Annotated[
    bool | None,
    typer.Option(
        help="Append the env's valid commands to every observation (as `agentgym train` shows them). "
        "Default: off, or as the training run given as --model played."
    ),
]
ConstrainActionsOpt = Annotated[
    bool | None,
    typer.Option(
        help="Reply only with one of the env's valid commands (constrained decoding, as `agentgym "
        "train` plays by default; --policy openai sends them as structured_outputs.choice); implies "
        "--show-actions. Default: off, or as the training run given as --model played."
    ),
]


def check_model_loads(kind: str, model: str | None) -> None:
    """Exit 2 within seconds when an hf/vllm ``model`` cannot load here, before any server starts."""
    from agentgym.play.evaluation import UsageError, check_policy_model

    try:
        check_policy_model(kind, model)
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
