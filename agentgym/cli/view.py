"""``agentgym view``: the trajectory viewer and live run dashboard."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from agentgym.cli.common import EXIT_USAGE, console, fail, listening_socket, run_uvicorn

if TYPE_CHECKING:
    pass


commands = typer.Typer()


@commands.command()
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
