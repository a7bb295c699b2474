"""The ``agentgym`` command line."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.table import Table

from agentgym import registry
from agentgym.errors import AgentGymError

app = typer.Typer(
    help="AgentGym: LLM agents in interactive text environments.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)

EXIT_USAGE = 2


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


def require_env(name: str) -> None:
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
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    max_sessions: Annotated[int, typer.Option(min=1, help="Live sessions at most (429 beyond).")] = 64,
    ttl: Annotated[float, typer.Option(min=1, help="Idle seconds before a session is closed.")] = 600.0,
    token: Annotated[
        str | None, typer.Option(envvar="AGENTGYM_TOKEN", help="Require this bearer token.")
    ] = None,
    max_body_bytes: Annotated[int, typer.Option(min=256, help="Largest request body (413 beyond).")] = 65536,
    engine_threads: Annotated[int, typer.Option(min=1, help="Threads for blocking engine calls.")] = 16,
    settings: Annotated[
        list[str], typer.Option("--set", help="Environment setting KEY=VALUE (YAML value); repeatable.")
    ] = [],  # noqa: B006 - typer reads the default, never mutates it
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve one environment over wire API v1 and the AgentGym-compatible routes."""
    import uvicorn

    from agentgym.servers.app import ServerConfig, create_app
    from agentgym.servers.launcher import KEEP_ALIVE_S

    require_env(env)
    config = ServerConfig(
        env=env,
        env_config=parse_settings(settings),
        max_sessions=max_sessions,
        ttl=ttl,
        token=token,
        max_body_bytes=max_body_bytes,
        engine_threads=engine_threads,
    )
    try:
        application = create_app(config)
    except TypeError as exc:  # a --set key the environment's constructor does not take
        raise fail(f"bad setting for {env!r}: {exc}", EXIT_USAGE) from None
    uvicorn.run(application, host=host, port=port, log_level=log_level, timeout_keep_alive=KEEP_ALIVE_S)


@app.command()
def up(
    envs: Annotated[list[str] | None, typer.Argument(help="Environments to start (default: all).")] = None,
    host: Annotated[str, typer.Option(help="Interface the servers bind.")] = "127.0.0.1",
    log_dir: Annotated[str, typer.Option(help="Folder for the servers' logs.")] = "runs/servers",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for each server's /health.")] = 180.0,
) -> None:
    """Start local env servers as subprocesses; Ctrl-C stops them all."""
    from agentgym.servers.launcher import serve_processes

    chosen = envs or registry.names()
    for name in chosen:
        require_env(name)
    os.makedirs(log_dir, exist_ok=True)
    with console.status(f"starting {', '.join(chosen)} ..."):
        stack = contextlib.ExitStack()
        try:
            servers = stack.enter_context(
                serve_processes(chosen, host=host, log_dir=log_dir, timeout=timeout)
            )
        except (RuntimeError, TimeoutError) as exc:
            stack.close()
            raise fail(f"{exc} (see the logs in {log_dir}/)") from None
    with stack:
        table = Table("env", "url", "pid", "log", title="AgentGym env servers")
        for server in servers:
            table.add_row(server.env, server.url, str(server.process.pid), server.log_path or "-")
        console.print(table)
        console.print("Press Ctrl-C to stop them.")
        try:
            while all(server.process.poll() is None for server in servers):
                time.sleep(0.5)
            dead = [s.env for s in servers if s.process.poll() is not None]
            raise fail(f"server(s) exited: {', '.join(dead)} (see {log_dir}/)")
        except KeyboardInterrupt:
            console.print("stopping ...")
    console.print("all servers stopped.")


@app.command("envs")
def list_envs(
    host: Annotated[str, typer.Option(help="Where to look for running servers.")] = "127.0.0.1",
) -> None:
    """List registered environments and whether a server runs on its default port."""
    from agentgym.servers.launcher import DEFAULT_PORTS

    table = Table("env", "default url", "running", "sessions")
    for name in registry.names():
        port = DEFAULT_PORTS.get(name)
        url = f"http://{host}:{port}" if port else "-"
        running, sessions = "no", "-"
        if port:
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


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":
    main()
