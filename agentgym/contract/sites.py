"""A web app served on loopback from a thread: the site a browser-mode env shops in (part of
the env contract, beside ``core.WEB_PREFIX``), and the servers' in-process hosting."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def serve_app(app: Any, host: str = "127.0.0.1", port: int = 0, **settings: Any) -> Iterator[str]:
    """Serve the ASGI ``app`` from a daemon thread on ``host:port`` (0: a free port, bound
    before the thread starts, so no one else can take it); yield its URL once it accepts
    requests, and stop it after. ``settings``: more ``uvicorn.Config`` fields."""
    import uvicorn

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **settings))
    bound = sock.getsockname()[1]
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"agentgym-app-{bound}")
    thread.daemon = True
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"the app on {host}:{bound} did not start")
        time.sleep(0.01)
    try:
        yield f"http://[{host}]:{bound}" if family == socket.AF_INET6 else f"http://{host}:{bound}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
