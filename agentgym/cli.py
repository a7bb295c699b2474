"""The ``agentgym`` command line."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple, TypeVar

import httpx
import typer
import yaml
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from agentgym import registry
from agentgym.errors import AgentGymError
from agentgym.inputs import decimal
from agentgym.trainers.cli import register as register_training_commands

if TYPE_CHECKING:
    from agentgym.policies.base import Policy, SamplingParams
    from agentgym.rollout import RolloutConfig
    from agentgym.servers.launcher import ServerProcess
    from agentgym.trajectory import Trajectory

app = typer.Typer(
    help="AgentGym: LLM agents in interactive text environments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

EXIT_USAGE = 2
T = TypeVar("T")


def fail(message: str, code: int = 1) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


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
    """Exit 2 unless ``name`` is a registered env. An OpenEnv server (``url`` a ws:// URL)
    serves an env of its own: its name is checked against the server's instead."""
    from agentgym.openenv_client import is_openenv_url

    if url is not None and is_openenv_url(url):
        return
    try:
        registry.resolve(name)
    except AgentGymError as exc:
        raise fail(exc.message, EXIT_USAGE) from None


@app.command()
def serve(
    env: Annotated[str, typer.Argument(help="Registered environment name (see `agentgym envs`).")],
    host: Annotated[
        str, typer.Option(help="Interface to bind; 0.0.0.0 exposes it to the network.")
    ] = "127.0.0.1",
    port: Annotated[
        int | None,
        typer.Option(
            envvar="AGENTGYM_PORT",
            help="TCP port (default: the env's port in the scheme of `agentgym envs`, textworld 8101).",
        ),
    ] = None,
    max_sessions: Annotated[int, typer.Option(min=1, help="Live sessions at most (429 beyond).")] = 64,
    ttl: Annotated[float, typer.Option(min=1, help="Idle seconds before a session is closed.")] = 600.0,
    token: Annotated[
        str | None, typer.Option(envvar="AGENTGYM_TOKEN", help="Require this bearer token.")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(min=256, help="Largest request body (413 beyond).")] = 65536,
    max_header_bytes: Annotated[
        int, typer.Option(min=1024, help="Largest request head: URL and headers (431 beyond).")
    ] = 16 * 1024,
    max_header_fields: Annotated[int, typer.Option(min=8, help="Header fields at most (431 beyond).")] = 100,
    request_timeout: Annotated[
        float, typer.Option(min=0.1, help="Seconds a request may take to arrive (408 beyond).")
    ] = 30.0,
    max_sessions_per_client: Annotated[
        int | None,
        typer.Option(min=1, help="Live sessions one client may hold (429 beyond; default: no quota)."),
    ] = None,
    quota_by_token: Annotated[
        bool,
        typer.Option(help="Count the quota per bearer token, not per address (behind a per-user proxy)."),
    ] = False,
    engine_threads: Annotated[int, typer.Option(min=1, help="Threads for blocking engine calls.")] = 16,
    step_deadline: Annotated[
        float, typer.Option(min=0.1, help="Seconds a step may take before its session fails (503).")
    ] = 60.0,
    reset_deadline: Annotated[float, typer.Option(min=0.1, help="Seconds a reset may take.")] = 600.0,
    warm: Annotated[
        int | None,
        typer.Option(min=0, help="Engines started ahead of demand (default: 2 per core)."),
    ] = None,
    settings: Annotated[
        list[str], typer.Option("--set", help="Environment setting KEY=VALUE (YAML value); repeatable.")
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    fd: FdOpt = None,
) -> None:
    """Serve one environment over wire API v1 and the AgentGym-compatible routes."""
    from agentgym.servers.app import ServerConfig, create_app
    from agentgym.servers.launcher import default_port

    require_env(env)
    env_config = parse_settings(settings)
    try:
        registry.check_settings(env, env_config)
        port = port or default_port(env)  # ValueError: a bad AGENTGYM_BASE_PORT
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    sock = listening_socket(host, port, fd, f"agentgym serve {env}")
    config = ServerConfig(
        env=env,
        env_config=env_config,
        max_sessions=max_sessions,
        ttl=ttl,
        token=token,
        max_body_bytes=max_body_bytes,
        max_header_bytes=max_header_bytes,
        max_header_fields=max_header_fields,
        request_timeout=request_timeout,
        max_sessions_per_client=max_sessions_per_client,
        quota_by_token=quota_by_token,
        engine_threads=engine_threads,
        step_deadline=step_deadline,
        reset_deadline=reset_deadline,
        warm=warm,
    )
    try:
        application = create_app(config)
    except TypeError as exc:  # a factory that takes **kwargs, refusing one of them
        raise fail(f"bad setting for {env!r}: {exc}", EXIT_USAGE) from None
    console.print(f"serving {env} at http://{host}:{port}  (Ctrl-C stops)", soft_wrap=True)
    run_uvicorn(application, sock, host, port, log_level)
    stuck = application.state.sessions.stuck_calls
    if stuck:  # Python would join those engine threads at exit, i.e. wait for ever
        console.print(f"{stuck} engine call(s) still stuck past their deadline; exiting without them")
        os._exit(0)


BasePortOpt = Annotated[
    int | None,
    typer.Option(
        envvar="AGENTGYM_BASE_PORT",
        min=1,
        max=65435,
        help="Base of the port scheme: the gateway listens on it, each env on it + its offset "
        "(textworld +1, webshop +2, search +3, sciworld +4, choice +5, math +6). Default 8100.",
    ),
]


def _base_port(given: int | None) -> int:
    from agentgym.servers.launcher import base_port

    try:
        return given or base_port()
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None


def parse_replica_counts(specs: list[str]) -> dict[str, int]:
    """``["textworld=3", "search"]`` -> ``{"textworld": 3, "search": 1}``; exits 2 on a bad one."""
    counts: dict[str, int] = {}
    for spec in specs:
        name, sep, count = spec.partition("=")
        require_env(name)
        number = decimal(count) if sep else 1
        if not number:
            raise fail(f"expected ENV or ENV=N with N >= 1, got {spec!r}", EXIT_USAGE)
        counts[name] = number
    return counts


def parse_ports(spec: str) -> list[int]:
    """``"9100-9102,9110"`` -> ``[9100, 9101, 9102, 9110]``; exits 2 on anything else."""
    ports: list[int] = []
    for part in spec.split(","):
        low, sep, high = part.strip().partition("-")
        first, last = decimal(low), decimal(high) if sep else decimal(low)
        if first is None or last is None or not 0 < first <= last < 65536:
            raise fail(
                f"--replica-ports expects ports and ranges like 9100-9199,9300, got {spec!r}", EXIT_USAGE
            )
        ports.extend(range(first, last + 1))
    return list(dict.fromkeys(ports))


def parse_replica_urls(pairs: list[str], config: Path | None) -> dict[str, list[str]]:
    """Replica URLs per env from ``--replica ENV=URL`` flags and a YAML file
    ``{replicas: {ENV: [URL, ...]}}`` (both add up); exits 2 on a bad entry."""
    replicas: dict[str, list[str]] = {}
    if config is not None:
        loaded = yaml.safe_load(config.read_text()) or {}
        for env, urls in (loaded.get("replicas") or {}).items():
            replicas.setdefault(env, []).extend([urls] if isinstance(urls, str) else urls)
    for pair in pairs:
        env, sep, url = pair.partition("=")
        if not sep or not url.startswith(("http://", "https://")):
            raise fail(f"--replica expects ENV=http://HOST:PORT, got {pair!r}", EXIT_USAGE)
        replicas.setdefault(env, []).append(url)
    if not replicas:
        raise fail("no replicas: give --replica ENV=URL (repeatable) or --config FILE", EXIT_USAGE)
    return replicas


@app.command()
def gateway(
    replica: Annotated[
        list[str], typer.Option(help="A replica: ENV=URL of an env server; repeat for more.")
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    config: Annotated[
        Path | None, typer.Option(exists=True, dir_okay=False, help="YAML: {replicas: {ENV: [URL, ...]}}.")
    ] = None,
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes it.")] = "127.0.0.1",
    port: Annotated[
        int | None, typer.Option(envvar="AGENTGYM_PORT", help="TCP port (default: the base port, 8100).")
    ] = None,
    health_interval: Annotated[float, typer.Option(min=0.1, help="Seconds between replica polls.")] = 2.0,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds a forwarded request may take.")] = 120.0,
    max_body_bytes: Annotated[int, typer.Option(min=1, help="Larger request bodies get 413.")] = 64 * 1024,
    token: Annotated[
        str | None,
        typer.Option(
            envvar="AGENTGYM_TOKEN", help="The replicas' token: /health lists replica URLs only with it."
        ),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    fd: FdOpt = None,
) -> None:
    """Serve /envs/ENV/... from replicas of each env: new sessions to the least-loaded
    healthy replica, every later call of a session to its replica."""
    from agentgym.servers.gateway import GatewayConfig, create_gateway_app
    from agentgym.servers.launcher import base_port

    try:
        port = port or base_port()
    except ValueError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    settings = GatewayConfig(
        parse_replica_urls(replica, config),
        health_interval=health_interval,
        timeout=timeout,
        max_body_bytes=max_body_bytes,
        token=token,
    )
    sock = listening_socket(host, port, fd, "agentgym gateway")
    console.print(f"gateway at http://{host}:{port}/envs/ENV  (Ctrl-C stops)", soft_wrap=True)
    run_uvicorn(create_gateway_app(settings), sock, host, port, log_level)


@app.command()
def up(
    envs: Annotated[
        list[str] | None,
        typer.Argument(help="Environments to start, ENV or ENV=REPLICAS (default: all, one each)."),
    ] = None,
    host: Annotated[str, typer.Option(help="Interface the servers bind.")] = "127.0.0.1",
    log_dir: Annotated[str, typer.Option(help="Folder for the servers' logs.")] = "runs/servers",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server's /health.")] = 180.0,
    use_gateway: Annotated[
        bool | None,
        typer.Option("--gateway/--no-gateway", help="Put a gateway in front (default: if any ENV=N)."),
    ] = None,
    base_port: BasePortOpt = None,
    gateway_port: Annotated[
        int | None, typer.Option(help="The gateway's port (default: the base port).")
    ] = None,
    warm: Annotated[
        int | None,
        typer.Option(
            min=0, help="Each server's --warm: engines started ahead of demand (default: 2 per core)."
        ),
    ] = None,
    replica_ports: Annotated[
        str | None,
        typer.Option(
            help="Ports for the env servers, e.g. 9100-9199 or 9100,9102 (taken in order, skipping "
            "busy ones; default: free ports behind a gateway, the scheme's without)."
        ),
    ] = None,
) -> None:
    """Start local env servers as subprocesses, each on its port of the scheme (base port +
    the env's offset; with ENV=N, N replicas on free ports behind a gateway on the base port);
    a server that dies is reported and restarted with backoff. SIGINT (Ctrl-C) or SIGTERM
    stops them all, the gateway first, and exits 0."""
    from agentgym.servers.launcher import PortInUse, Supervisor, serve_fleet, serve_processes

    specs = envs or registry.names()
    counts = parse_replica_counts(specs)
    base = _base_port(base_port)
    ports = parse_ports(replica_ports) if replica_ports else []
    if ports and len(ports) < sum(counts.values()):
        raise fail(
            f"--replica-ports {replica_ports} has fewer ports than the {sum(counts.values())} servers",
            EXIT_USAGE,
        )
    if use_gateway is None:
        use_gateway = any("=" in spec for spec in specs)
    os.makedirs(log_dir, exist_ok=True)
    server_args = ["--warm", str(warm)] if warm is not None else []
    common = dict(host=host, log_dir=log_dir, timeout=timeout, server_args=server_args)
    if use_gateway:
        starting = serve_fleet(counts, gateway_port=gateway_port or base, replica_ports=ports, **common)
    else:
        starting = serve_processes(list(counts), base=base, ports=ports, **common)
    stack = contextlib.ExitStack()
    try:
        stack.enter_context(_stop_on_signals())  # left last: stopping is not interrupted
        with console.status(f"starting {', '.join(specs)} ..."):
            try:
                servers = stack.enter_context(starting)
            except PortInUse as exc:
                hint = "stop what holds it, or choose other ports (--base-port, --replica-ports)"
                raise fail(f"{exc}: {hint}") from None
            except (RuntimeError, TimeoutError) as exc:
                raise fail(f"{exc} (see the logs in {log_dir}/)") from None
        _print_servers(servers, list(counts) if use_gateway else [])
        supervisor = Supervisor(servers)
        while True:  # a server that dies is restarted; the others (and the gateway) keep serving
            for event in supervisor.poll():
                console.print(f"[yellow]{event}[/] (see {log_dir}/)")
            time.sleep(0.5)
    except KeyboardInterrupt:  # a signal while starting (what started is stopped) or serving
        console.print("stopping ...")
    finally:
        stack.close()
    console.print("all servers stopped.")


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """Within: SIGINT and SIGTERM raise KeyboardInterrupt, however ``up`` was started (a
    shell that starts a job in the background hands it SIGINT ignored, and SIGTERM's
    default would end ``up`` before it stops its children). The first signal starts the
    stop; later ones are ignored so that it runs to the end (each child gets SIGINT, then
    SIGKILL after 15 s). The previous handlers come back on exit."""

    def stop(signum: int, frame: object) -> None:
        for each in previous:
            signal.signal(each, signal.SIG_IGN)
        raise KeyboardInterrupt

    previous = {each: signal.getsignal(each) for each in (signal.SIGINT, signal.SIGTERM)}
    for each in previous:
        signal.signal(each, stop)
    try:
        yield
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def _print_servers(servers: list[ServerProcess], gateway_envs: list[str]) -> None:
    """The table of started servers; with a gateway (last server), the URL clients use per env."""
    table = Table("env", "url", "pid", "log", title="AgentGym env servers")
    for server in servers:
        table.add_row(server.env, server.url, str(server.process.pid), server.log_path or "-")
    console.print(table)
    for env in gateway_envs:
        console.print(f"{env}: {servers[-1].url}/envs/{env}")
    console.print("Press Ctrl-C to stop them.")


@app.command("envs")
def list_envs(
    host: Annotated[str, typer.Option(help="Where to look for running servers.")] = "127.0.0.1",
    base_port: BasePortOpt = None,
) -> None:
    """List registered environments, their default URL (the port scheme `serve`, `up` and
    the Gymnasium adapter use) and whether a server runs there."""
    from agentgym.servers.launcher import default_port

    base = _base_port(base_port)
    table = Table("env", "default url", "running", "sessions", title=f"base port {base}")
    for name in registry.names():
        url = f"http://{host}:{default_port(name, base)}"
        running, sessions = "no", "-"
        with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
            health = httpx.get(f"{url}/health", timeout=1.0).json()
            if health.get("env") == name:
                running, sessions = "[green]yes[/]", f"{health['sessions']}/{health['capacity']}"
        table.add_row(name, url, running, sessions)
    console.print(table)


@app.command("check-env")
def check_env(
    url: Annotated[str, typer.Argument(help="Base URL of an env server, e.g. http://127.0.0.1:8101")],
    token: Annotated[str | None, typer.Option(envvar="AGENTGYM_TOKEN", help="Bearer token.")] = None,
    task_id: Annotated[str | None, typer.Option(help="Task to play (default: the first test task).")] = None,
) -> None:
    """Check a server against wire API v1, one line per check; exit 1 if any fails."""
    from agentgym.checker import run_checks

    table = Table("check", "result", "detail")
    results = run_checks(url, token=token, task_id=task_id)
    for result in results:
        mark = "[green]PASS[/]" if result.passed else "[bold red]FAIL[/]"
        table.add_row(result.name, mark, result.detail)
    console.print(table)
    failed = sum(not r.passed for r in results)
    console.print(f"{len(results) - failed} passed, {failed} failed")
    if failed:
        raise typer.Exit(1)


# ----- eval and collect ---------------------------------------------------------------------

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
        "ws://HOST:PORT: an OpenEnv server (docs/openenv.md).",
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
        help="hf policy: reply only with one of the env's valid commands (constrained decoding, "
        "as `agentgym train` plays by default); implies --show-actions. Default: off, or as the "
        "training run given as --model played."
    ),
]
PLAY_DEFAULTS: dict[str, Any] = {
    "agent_format": "react",
    "max_new_tokens": 128,
    "max_turns": None,
    "show_actions": False,
    "constrain_actions": False,
}
"""How ``eval`` plays a model that is not a training run, where no option says otherwise."""


def _require_policy(kind: str) -> None:
    from agentgym.policies import POLICY_KINDS

    if kind not in POLICY_KINDS:
        raise fail(f"unknown policy {kind!r}; choose one of {', '.join(POLICY_KINDS)}", EXIT_USAGE)


def _rollout_config(
    agent_format: str,
    max_turns: int | None,
    concurrency: int,
    temperature: float,
    max_new_tokens: int,
    history_turns: int | None,
    show_actions: bool = False,
    constrain_actions: bool = False,
) -> RolloutConfig:
    from agentgym.agents import FORMATS
    from agentgym.policies.base import SamplingParams
    from agentgym.rollout import RolloutConfig

    if agent_format not in FORMATS:
        raise fail(f"unknown agent format {agent_format!r}; formats are {', '.join(FORMATS)}", EXIT_USAGE)
    return RolloutConfig(
        max_turns=max_turns,
        concurrency=concurrency,
        sampling=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
        format=agent_format,
        history_turns=history_turns,
        show_actions=show_actions or constrain_actions,
        constrain_actions=constrain_actions,
    )


def _as_the_run_played(model: str | None, policy: str) -> dict[str, Any]:
    """``PLAY_DEFAULTS``, or, for a training run's model, how the run's held-out evaluation
    played (its model was trained on that format and those observations)."""
    from agentgym.policies.runs import evaluation_rollout

    try:
        played = evaluation_rollout(model) if policy == "hf" else None  # vllm refuses a run folder
    except (OSError, ValueError, yaml.YAMLError) as exc:  # e.g. a run of an older version
        console.print(
            f"[yellow]the run's config.yaml does not load ({exc}); playing with eval's defaults[/yellow]"
        )
        return PLAY_DEFAULTS
    if played is None:
        return PLAY_DEFAULTS
    settings = {
        "agent_format": played.format,
        "max_new_tokens": played.sampling.max_new_tokens,
        "max_turns": played.max_turns,
        "show_actions": played.show_actions,
        "constrain_actions": played.constrain_actions,
    }
    console.print(
        "playing as the run's held-out evaluation did (options given override): "
        + ", ".join(f"{name} {value}" for name, value in settings.items())
    )
    return settings


def _check_model(kind: str, model: str | None) -> None:
    """Exit 2 within seconds when an hf/vllm ``model`` cannot load here, before any server starts."""
    from agentgym.evaluation import UsageError, check_policy_model

    try:
        check_policy_model(kind, model)
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None


class PolicyChoice(NamedTuple):
    """The policy options of ``eval`` and ``collect`` (see ``evaluation.build_policy``)."""

    kind: str
    model: str | None
    base_url: str | None
    api_key: str | None
    concurrency: int
    tool_calls: bool = False


def _run_policy_job(
    env: str,
    url: str | None,
    log_dir: Path,
    token: str | None,
    job: Callable[[str, Policy, EpisodeCallbacks], Awaitable[T]],
    choice: PolicyChoice,
) -> T:
    """Start the env server unless ``url`` is given, build the ``choice`` of policy,
    run ``job(url, policy, (on_plan, on_episode))`` under an episode progress bar, close
    both. Bad arguments exit with code 2, a server that fails to start with 1."""
    from agentgym.evaluation import UsageError, build_policy, check_server, env_server

    _check_model(choice.kind, choice.model)

    async def run(server_url: str, policy: Policy) -> T:
        progress, *callbacks = _episode_progress()
        try:
            with progress:
                return await job(server_url, policy, tuple(callbacks))
        finally:
            await policy.close()

    with contextlib.ExitStack() as stack:
        with console.status(f"starting a local {env} server ..." if url is None else "connecting ..."):
            try:
                server_url = stack.enter_context(env_server(env, url, log_dir))
            except (RuntimeError, TimeoutError) as exc:
                raise fail(f"{exc} (see the logs in {log_dir}/)") from None
        try:
            asyncio.run(check_server(server_url, env, token))
            with console.status(f"loading the {choice.kind} policy ..."):
                args = _policy_args(choice, choice.model)
                policy = build_policy(choice.kind, **args, tool_calls=choice.tool_calls)
            return asyncio.run(run(server_url, policy))
        except UsageError as exc:
            raise fail(str(exc), EXIT_USAGE) from None


EpisodeCallbacks = tuple[Callable[[int, int], None], Callable[["Trajectory"], None]]
"""``(on_plan(total, done), on_episode(trajectory))``: what drives an episode progress bar."""


class EtaColumn(ProgressColumn):
    """Time left at the average pace since the start, counting only episodes run now (not
    those a resumed eval found done). Rich's own estimate needs two episodes finished within
    its 30 s window, so a slow model's eval showed ``-:--:--`` for its whole run."""

    def render(self, task: Task) -> Text:
        ran = task.completed - task.fields.get("resumed", 0)
        if task.total is None or not ran or not task.elapsed:
            return Text("eta -:--:--", style="progress.remaining")
        left = task.elapsed / ran * (task.total - task.completed)
        return Text(
            f"eta {int(left) // 3600}:{int(left) % 3600 // 60:02d}:{int(left) % 60:02d}",
            style="progress.remaining",
        )


def _episode_progress() -> tuple[Progress, Callable[[int, int], None], Callable[[Trajectory], None]]:
    """A rich progress bar and the two callbacks that drive it."""
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        EtaColumn(),
        console=console,
    )
    bar = progress.add_task("episodes", total=None)
    tally = {"success": 0, "errored": 0}

    def on_plan(total: int, done: int) -> None:
        progress.update(bar, total=total, completed=done, resumed=done)

    def on_episode(trajectory: Trajectory) -> None:
        tally["success"] += trajectory.success
        tally["errored"] += trajectory.errored
        description = f"success {tally['success']}  errors {tally['errored']}"
        progress.update(bar, advance=1, description=description)

    return progress, on_plan, on_episode


def _show(value: Any) -> str:
    """A results value as a table cell."""
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _results_table(results: dict[str, Any]) -> Table:
    table = Table("metric", "value", title=f"{results['env']} / {results['split']} / {results['policy']}")
    rows = ["episodes", "tasks", "k", "seed", "success_rate", "success_rate_excluding_errors", "mean_score"]
    rows += [
        "avg_at_k",
        "mean_turns",
        "invalid_reply_rate",
        "errored",
        "resumed",
        "ran",
        "episodes_per_min",
        "generated_tokens_per_s",
    ]
    for key in rows:
        table.add_row(key, _show(results[key]))
    for j, value in results["pass_at_k"].items():
        table.add_row(f"pass@{j}", _show(value))
    if results["error_kinds"]:
        table.add_row("error kinds", ", ".join(f"{kind} x{n}" for kind, n in results["error_kinds"].items()))
    return table


def _families_table(results: dict[str, Any]) -> Table:
    """One row per challenge (task family: the task id up to its first ``/``)."""
    columns = {  # short headers: the table must fit 80 columns
        "episodes": "episodes",
        "success_rate": "success",
        "mean_score": "score",
        "mean_turns": "turns",
        "invalid_reply_rate": "invalid",
        "errored": "errored",
    }
    table = Table(title="per challenge (invalid: share of replies that did not parse)")
    table.add_column("challenge", no_wrap=True)  # squeeze the figures, never the names
    for header in columns.values():
        table.add_column(header)
    for family, figures in results["by_family"].items():
        table.add_row(family, *(_show(figures[key]) for key in columns))
    return table


@app.command("eval")
def evaluate_policy(
    env: Annotated[str, typer.Option(help="Environment to evaluate on (see `agentgym envs`).")],
    policy: PolicyOpt = "hf",
    split: Annotated[str, typer.Option(help="Task split: train, validation (or dev) or test.")] = "test",
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    tool_calls: ToolCallsOpt = False,
    n: TasksOpt = None,
    k: Annotated[int, typer.Option(min=1, help="Samples per task (Avg@k, Pass@k).")] = 1,
    max_turns: MaxTurnsOpt = None,
    concurrency: ConcurrencyOpt = 8,
    temperature: TemperatureOpt = None,
    max_new_tokens: MaxNewTokensOpt = None,
    agent_format: Annotated[
        str | None,
        typer.Option(
            "--format",
            help="Reply format: react, json or plain. Default: react, or the training run's "
            "(--model runs/<run>).",
        ),
    ] = None,
    history_turns: HistoryOpt = None,
    show_actions: ShowActionsOpt = None,
    constrain_actions: ConstrainActionsOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Results folder; re-running with the same one resumes (default: a new one)."),
    ] = None,
    url: EnvUrlOpt = None,
    token: TokenOpt = None,
    critic: Annotated[
        str | None,
        typer.Option(
            help="Critic model (same backend as --policy). math: critique-then-refine and "
            "critique-filtered voting; other envs: each episode is critiqued and replayed with the critique."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds env resets and sampling: a re-run plays the same.")] = 0,
    max_error_rate: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Exit with code 3 when more than this share of episodes failed for infrastructure "
            "reasons (model or env server unreachable or failing).",
        ),
    ] = 0.1,
) -> None:
    """Evaluate a policy on a task split: success rate, score, turns, invalid replies,
    Avg@k, Pass@k, per challenge (with --critic: Acc, Acc@Refine, Acc@Dis, the deltas and
    voting accuracy). A training run given as --model plays as its held-out evaluation did
    (reply format and length, valid commands shown or constrained, turn limit), unless an
    option says otherwise. Exit code 3: too many episodes failed for infrastructure reasons."""
    from agentgym.evaluation import (
        EXIT_INFRASTRUCTURE,
        RESULTS_FILE,
        TRAJECTORIES_FILE,
        EvalConfig,
        evaluate,
        infrastructure_failure,
    )

    require_env(env, url)
    _require_policy(policy)
    if constrain_actions and policy != "hf":
        raise fail("--constrain-actions needs --policy hf (the others decode unconstrained)", EXIT_USAGE)
    temperature = temperature if temperature is not None else (0.0 if k == 1 else 1.0)
    out = out or Path("runs/eval") / f"{env}-{split}-{policy}-{time.strftime('%Y%m%d-%H%M%S')}"
    given = {
        "agent_format": agent_format,
        "max_new_tokens": max_new_tokens,
        "max_turns": max_turns,
        "show_actions": show_actions,
        "constrain_actions": constrain_actions,
    }
    played = _as_the_run_played(model, policy)
    play = {name: played[name] if value is None else value for name, value in given.items()}
    rollout = _rollout_config(
        play["agent_format"],
        play["max_turns"],
        concurrency,
        temperature,
        play["max_new_tokens"],
        history_turns,
        play["show_actions"],
        play["constrain_actions"],
    )
    choice = PolicyChoice(policy, model, base_url, api_key, concurrency, tool_calls)
    if critic is not None:
        from agentgym.evaluation import CRITIC_ENVS

        _check_model(policy, critic)
        if env in CRITIC_ENVS:
            _evaluate_with_critic(env, split, n, k, choice, critic, rollout.sampling, out, url)
        else:
            _evaluate_episodes_with_critic(env, split, n, choice, critic, rollout, out, url, token)
        return
    config = EvalConfig(env=env, out_dir=out, split=split, n=n, k=k, rollout=rollout, seed=seed)

    async def job(server_url: str, built: Policy, callbacks: EpisodeCallbacks) -> dict[str, Any]:
        on_plan, on_episode = callbacks
        return await evaluate(server_url, built, config, token=token, on_plan=on_plan, on_episode=on_episode)

    results = _run_policy_job(env, url, out / "servers", token, job, choice)
    console.print(_results_table(results))
    console.print(_families_table(results))
    console.print(f"results: {out / RESULTS_FILE}\ntrajectories: {out / TRAJECTORIES_FILE}")
    if reason := infrastructure_failure(results, max_error_rate):
        raise fail(reason, EXIT_INFRASTRUCTURE)


def _evaluate_with_critic(
    env: str,
    split: str,
    n: int | None,
    k: int,
    choice: PolicyChoice,
    critic: str,
    sampling: SamplingParams,
    out: Path,
    url: str | None,
) -> None:
    """``eval --critic``: the actor (``choice``) and the critic (same backend, model
    ``critic``) play critique rounds on ``split``'s problems; no env server is involved."""
    from agentgym.evaluation import UsageError, build_policy, evaluate_critic, math_problems

    if url is not None:
        raise fail("--critic reads the problems from the math catalogue itself: drop --url", EXIT_USAGE)

    async def run() -> dict[str, Any]:
        actor = build_policy(choice.kind, **_policy_args(choice, choice.model))
        judge = build_policy(choice.kind, **_policy_args(choice, critic))
        try:
            return await evaluate_critic(actor, judge, math_problems(split, n), out, k=k, sampling=sampling)
        finally:
            await actor.close()
            await judge.close()

    try:
        with console.status("critique rounds ..."):
            results = asyncio.run(run())
    except UsageError as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    _print_critic_results(env, split, results, out)


def _evaluate_episodes_with_critic(
    env: str,
    split: str,
    n: int | None,
    choice: PolicyChoice,
    critic: str,
    rollout: RolloutConfig,
    out: Path,
    url: str | None,
    token: str | None,
) -> None:
    """``eval --critic`` on an agent env: the actor plays episodes, the critic (same backend,
    model ``critic``) judges each one, the actor replays each task with the critique."""
    from agentgym.evaluation import build_policy, evaluate_episode_critic

    async def job(server_url: str, actor: Policy, callbacks: EpisodeCallbacks) -> dict[str, Any]:
        judge = build_policy(choice.kind, **_policy_args(choice, critic))
        on_plan, on_episode = callbacks
        try:
            return await evaluate_episode_critic(
                server_url,
                actor,
                judge,
                env,
                split,
                n,
                out,
                rollout=rollout,
                token=token,
                on_plan=on_plan,
                on_episode=on_episode,
            )
        finally:
            await judge.close()

    results = _run_policy_job(env, url, out / "servers", token, job, choice)
    _print_critic_results(env, split, results, out)


def _print_critic_results(env: str, split: str, results: dict[str, Any], out: Path) -> None:
    from agentgym.evaluation import CRITIQUES_FILE, RESULTS_FILE

    table = Table(
        "metric", "value", title=f"{env} / {split} / {results['policy']} + critic {results['critic']}"
    )
    for key, value in results.items():
        if not isinstance(value, str):
            table.add_row(key, _show(value))
    console.print(table)
    console.print(f"results: {out / RESULTS_FILE}\ncritiques: {out / CRITIQUES_FILE}")


def _policy_args(choice: PolicyChoice, model: str | None) -> dict[str, Any]:
    return {
        "model": model,
        "base_url": choice.base_url,
        "api_key": choice.api_key,
        "concurrency": choice.concurrency,
    }


@app.command()
def collect(
    env: Annotated[str, typer.Option(help="Environment to play (see `agentgym envs`).")],
    out: Annotated[Path, typer.Option(help="Dataset file to write (JSONL; replaced).")],
    policy: PolicyOpt = "expert",
    split: Annotated[str, typer.Option(help="Task split: train, validation (or dev) or test.")] = "train",
    output_format: Annotated[
        str, typer.Option("--format", help="trajectory (our records) or agentgym (AgentGym conversations).")
    ] = "trajectory",
    agent_format: Annotated[
        str, typer.Option(help="Reply format of the agent turns: react, json or plain.")
    ] = "react",
    keep_failed: Annotated[
        bool, typer.Option("--all", help="Keep failed episodes too (errored ones are never kept).")
    ] = False,
    model: ModelOpt = None,
    base_url: BaseUrlOpt = None,
    api_key: ApiKeyOpt = None,
    tool_calls: ToolCallsOpt = False,
    n: TasksOpt = None,
    max_turns: MaxTurnsOpt = None,
    concurrency: ConcurrencyOpt = 8,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 0.0,
    max_new_tokens: MaxNewTokensOpt = 128,
    url: EnvUrlOpt = None,
    token: TokenOpt = None,
) -> None:
    """Play every task of a split (the expert by default) and write a trajectory dataset."""
    from agentgym.evaluation import DATASET_FORMATS, collect

    require_env(env)
    _require_policy(policy)
    if output_format not in DATASET_FORMATS:
        raise fail(
            f"unknown --format {output_format!r}; choose one of {', '.join(DATASET_FORMATS)}", EXIT_USAGE
        )
    rollout = _rollout_config(agent_format, max_turns, concurrency, temperature, max_new_tokens, None)

    async def job(server_url: str, built: Policy, callbacks: EpisodeCallbacks) -> dict[str, int]:
        on_plan, on_episode = callbacks
        return await collect(
            server_url,
            built,
            env,
            out,
            split=split,
            n=n,
            rollout=rollout,
            output_format=output_format,
            only_success=not keep_failed,
            token=token,
            on_plan=on_plan,
            on_episode=on_episode,
        )

    counts = _run_policy_job(
        env,
        url,
        out.parent / "servers",
        token,
        job,
        PolicyChoice(policy, model, base_url, api_key, concurrency, tool_calls),
    )
    console.print(
        f"wrote {counts['written']} of {counts['episodes']} episodes to {out} ({counts['errored']} errored)"
    )


@app.command()
def view(
    path: Annotated[Path, typer.Argument(help="A run folder or a trajectory JSONL file.")],
    host: Annotated[str, typer.Option(help="Interface to bind; keep 127.0.0.1 unless you mean to share.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port.")] = 8300,
    open_browser: Annotated[
        bool, typer.Option("--open/--no-open", help="Open the page in a browser.")
    ] = True,
) -> None:
    """Replay trajectories and watch a training run's curves in a local web page."""
    import threading
    import webbrowser

    from agentgym.viewer import NotTrajectoryFile, create_app
    from agentgym.viewer.app import viewer_hosts

    try:
        application = create_app(path, allowed_hosts=viewer_hosts(host))
    except NotTrajectoryFile as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    info = application.state.index.facets()
    if not info["episodes"] and not (path / "metrics.jsonl").is_file():
        raise fail(f"{path} holds no trajectory JSONL and no metrics.jsonl", EXIT_USAGE)
    sock = listening_socket(host, port, None, "agentgym view")  # the URL is announced only once it is ours
    url = f"http://{host}:{port}/"
    console.print(f"viewing {path} ({info['episodes']} episodes) at {url}  (Ctrl-C stops)")
    if open_browser:  # the socket listens already: the browser's request waits in its backlog
        threading.Thread(target=webbrowser.open, args=[url], daemon=True).start()
    run_uvicorn(application, sock, host, port, "warning")


@app.command("export")
def export_model(
    run: Annotated[Path, typer.Argument(help="A training run folder, or one of its checkpoints/step-N.")],
    out: Annotated[Path, typer.Option(help="The folder to write (new, or empty).")],
    step: Annotated[
        int | None,
        typer.Option(min=0, help="Export this step's checkpoint (default: the newest complete one)."),
    ] = None,
) -> None:
    """Save a training run's model as a standalone Hugging Face folder: trained weights
    merged into the base model (safetensors), tokenizer, config and a model card."""
    from agentgym.export import export_run

    try:
        with console.status(f"exporting {run} ..."):
            folder = export_run(run, out, step=step)
    except (ValueError, RuntimeError, OSError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    console.print(f"wrote {folder}; load it with AutoModelForCausalLM.from_pretrained({str(folder)!r})")


@app.command("export-trajectories")
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
    from agentgym.trajectory_table import export_trajectories as export

    try:
        written = export(path, out, output_format)
    except (ValueError, OSError) as exc:
        raise fail(str(exc), EXIT_USAGE) from None
    console.print(f"wrote {written}")


@app.command("serve-model")
def serve_model(
    model: ModelOpt = None,
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes it to the network.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port.")] = 8200,
    device: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda when available).")] = None,
    dtype: Annotated[
        str | None, typer.Option(help="e.g. bfloat16 (default: bf16 on GPU, fp32 on CPU).")
    ] = None,
    max_batch_size: Annotated[int, typer.Option(min=1, help="Requests decoded together at most.")] = 8,
    served_model_name: Annotated[str | None, typer.Option(help="The name /v1/models reports.")] = None,
    api_key: Annotated[str | None, typer.Option(help="Require this bearer token.")] = None,
) -> None:
    """Serve a local model or a training run over OpenAI's chat-completions API
    (/v1/chat/completions, /v1/models); `eval --policy openai --base-url` plays it."""
    from agentgym.policies.models import DEFAULT_MODEL
    from agentgym.servers.openai_compat import serve_model as serve

    _check_model("hf", model)
    serve(
        model or DEFAULT_MODEL,
        host=host,
        port=port,
        device=device,
        dtype=dtype,
        max_batch_size=max_batch_size,
        served_model_name=served_model_name,
        api_key=api_key,
    )


register_training_commands(app)

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


if __name__ == "__main__":
    main()
