"""``agentgym serve``, ``gateway``, ``up``, ``envs`` and ``check-env``: running the env servers."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import httpx
import typer
import yaml
from rich.table import Table

from agentgym import hosting, registry
from agentgym.cli.common import (
    EXIT_USAGE,
    FdOpt,
    console,
    fail,
    listening_socket,
    parse_settings,
    require_env,
    run_uvicorn,
)
from agentgym.contract.inputs import decimal

if TYPE_CHECKING:
    from agentgym.servers.launcher import ServerProcess


commands = typer.Typer()


@commands.command()
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
    max_sessions: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Live sessions at most (429 beyond; default: the env's hosting.toml, else 64).",
        ),
    ] = None,
    ttl: Annotated[float, typer.Option(min=1, help="Idle seconds before a session is closed.")] = 600.0,
    mcp_ttl: Annotated[
        float, typer.Option(min=1, help="Idle seconds before an MCP session without an episode is closed.")
    ] = 30.0,
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
        max_sessions=max_sessions or hosting.session_cap(env),
        ttl=ttl,
        mcp_ttl=mcp_ttl,
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


@commands.command()
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


@commands.command()
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


@commands.command("envs")
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


@commands.command("check-env")
def check_env(
    url: Annotated[str, typer.Argument(help="Base URL of an env server, e.g. http://127.0.0.1:8101")],
    token: Annotated[str | None, typer.Option(envvar="AGENTGYM_TOKEN", help="Bearer token.")] = None,
    task_id: Annotated[str | None, typer.Option(help="Task to play (default: the first test task).")] = None,
) -> None:
    """Check a server against wire API v1, one line per check; exit 1 if any fails."""
    from agentgym.conformance.runner import run_checks

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
