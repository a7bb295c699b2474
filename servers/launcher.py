"""Start env servers: in a background thread (tests, notebooks) or as subprocesses
(``agentgym up``), optionally several replicas per env behind a gateway, and wait until
their ``/health`` answers."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import httpx
from fastapi import FastAPI

from agentgym import hosting
from agentgym.contract.sites import serve_app
from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.http_protocol import http_protocol

HTTP_PROTOCOL = http_protocol()
"""uvicorn's ``http`` setting for every server here: httptools, with h11 for requests whose
method llhttp refuses (:mod:`agentgym.servers.http_protocol`)."""

KEEP_ALIVE_S = 65
"""Server-side idle keep-alive. Clients (httpx: 5 s, aiohttp: 15 s) must drop idle connections first;
equal timeouts race, and a request sent on a connection the server is closing fails."""

BASE_PORT = 8100
"""The port scheme, one for every surface (``serve``, ``up``, ``gateway``, ``envs``, the
Gymnasium adapter, docker compose): the gateway listens on the base port and each env
server on the base plus its offset. ``AGENTGYM_BASE_PORT`` (or ``up --base-port``) moves
all of them together."""

BASE_PORT_VARIABLE = "AGENTGYM_BASE_PORT"

ENV_PORT_OFFSETS = {h.env: h.port for h in hosting.builtin()}
"""The built-in environments' fixed offsets, from their folders' declarations (textworld:
8101, ..., babyai: 8108)."""

PLUGIN_OFFSETS = range(10, 100)
"""Other environments (plugins, tests) get an offset in this range from a hash of their
name: the same on every machine, whatever else is installed."""


class PortInUse(RuntimeError):
    """A server's port is taken by another process."""


def base_port() -> int:
    """``$AGENTGYM_BASE_PORT``, else :data:`BASE_PORT`."""
    value = os.environ.get(BASE_PORT_VARIABLE, "")
    if not value.strip():
        return BASE_PORT
    if not value.strip().isdigit() or not 0 < int(value) < 65536 - PLUGIN_OFFSETS.stop:
        raise ValueError(f"{BASE_PORT_VARIABLE} must be a port number below {65536 - PLUGIN_OFFSETS.stop}")
    return int(value)


def default_port(env: str, base: int | None = None) -> int:
    """Where ``env``'s server listens unless told otherwise: ``base`` (default
    :func:`base_port`) plus the env's offset."""
    offset = ENV_PORT_OFFSETS.get(env)
    if offset is None:
        offset = PLUGIN_OFFSETS[zlib.crc32(env.encode()) % len(PLUGIN_OFFSETS)]
    return (base_port() if base is None else base) + offset


def free_port(host: str = "127.0.0.1") -> int:
    """A port free right now (tests; it can be taken before you bind it: servers started
    here bind through :func:`bind_listener` instead)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def bind_listener(host: str, port: int, what: str = "the server") -> socket.socket:
    """A listening TCP socket on ``host:port`` (0: a free port), bound before anything is
    announced or started, so no other process can take the port in between. ``PortInUse``
    (saying who asked for it) when the port is taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    # Like uvicorn: a restarted server may rebind while old connections sit in TIME_WAIT.
    # On Linux this never lets two sockets listen on one port.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise PortInUse(f"cannot listen on {host}:{port} for {what}: {exc.strerror or exc}") from None
    sock.listen(2048)
    return sock


def bind_first(host: str, ports: Iterator[int], what: str) -> socket.socket:
    """A listener on the first free port ``ports`` yields (taken ports are skipped; the
    iterator moves past the one bound, so the next server gets a later port);
    ``PortInUse`` when none is left."""
    for port in ports:
        with contextlib.suppress(PortInUse):
            return bind_listener(host, port, what)
    raise PortInUse(f"no free port left among the replica ports for {what}")


def wait_healthy(url: str, timeout: float = 120.0, process: subprocess.Popen | None = None) -> None:
    """Poll ``url/health`` until it answers 200; fail early if ``process`` died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server process exited with code {process.returncode} before {url} was up")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{url}/health did not answer within {timeout:.0f}s")


@contextlib.contextmanager
def serve_in_thread(
    app_or_config: FastAPI | ServerConfig, host: str = "127.0.0.1", port: int | None = None
) -> Iterator[str]:
    """Run an env server (an app, or the app of a config) in a daemon thread; yield its URL
    once ``/health`` answers."""
    app = create_app(app_or_config) if isinstance(app_or_config, ServerConfig) else app_or_config
    with serve_app(app, host, port or 0, timeout_keep_alive=KEEP_ALIVE_S, http=HTTP_PROTOCOL) as url:
        wait_healthy(url)
        yield url


@dataclass
class ServerProcess:
    env: str
    url: str
    process: subprocess.Popen
    log_path: str | None = None
    extra_args: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    """The command line (without ``--fd``), so that a supervisor can start it again on the
    same port (same URL)."""
    host: str = "127.0.0.1"
    port: int = 0

    def restart(self) -> None:
        """Start the command again in place of a process that exited, on its port bound
        afresh: ``PortInUse`` when another process took the port meanwhile."""
        with contextlib.closing(bind_listener(self.host, self.port, self.env)) as listener:
            self.process = _popen(self.command, self.log_path, listener)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGINT (uvicorn's graceful shutdown), then SIGKILL if it hangs."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_server_process(
    env: str,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    extra_args: list[str] | None = None,
    log_path: str | None = None,
    listener: socket.socket | None = None,
) -> ServerProcess:
    """Launch ``agentgym serve ENV`` as a child process (not yet waited for) on ``listener``
    (a socket already bound for it) or else on ``port`` (None: a free one), bound here
    first: ``PortInUse`` when it is taken."""
    listener = listener or bind_listener(host, port or 0, env)
    return _spawn(env, ["serve", env], host, listener, extra_args or [], log_path)


def start_gateway_process(
    replicas: dict[str, list[str]],
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    log_path: str | None = None,
    listener: socket.socket | None = None,
) -> ServerProcess:
    """Launch ``agentgym gateway`` in front of ``replicas`` (env -> URLs) as a child process,
    on ``listener`` (a socket already bound for it) or else on ``port`` (None: a free one)."""
    flags = [arg for env, urls in replicas.items() for url in urls for arg in ("--replica", f"{env}={url}")]
    listener = listener or bind_listener(host, port or 0, "the gateway")
    return _spawn("gateway", ["gateway"], host, listener, flags, log_path)


def _spawn(
    name: str,
    command: list[str],
    host: str,
    listener: socket.socket,
    extra_args: list[str],
    log_path: str | None,
) -> ServerProcess:
    """Start ``agentgym COMMAND`` on ``listener``, which the child inherits and owns from
    then on (this process closes its copy, so a server that dies refuses connections
    instead of leaving them queued)."""
    port = listener.getsockname()[1]
    cmd = [sys.executable, "-m", "agentgym.cli", *command, "--host", host, "--port", str(port), *extra_args]
    with contextlib.closing(listener):
        process = _popen(cmd, log_path, listener)
    return ServerProcess(name, f"http://{host}:{port}", process, log_path, extra_args, cmd, host, port)


def _popen(cmd: list[str], log_path: str | None, listener: socket.socket) -> subprocess.Popen:
    """Start ``cmd`` serving on ``listener`` (handed down as ``--fd``)."""
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - handed to the child
    try:
        return subprocess.Popen(
            [*cmd, "--fd", str(listener.fileno())],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
            preexec_fn=_die_with_parent,
            pass_fds=(listener.fileno(),),
        )
    finally:
        if log_path:
            log.close()  # the child holds its own descriptor


@contextlib.contextmanager
def serve_processes(
    envs: list[str],
    host: str = "127.0.0.1",
    log_dir: str | None = None,
    timeout: float = 180.0,
    base: int | None = None,
    server_args: list[str] | None = None,
    ports: Sequence[int] = (),
) -> Iterator[list[ServerProcess]]:
    """Start one server process per env (``agentgym serve ENV`` plus ``server_args``), each
    on the next free one of ``ports`` when given, else on its :func:`default_port` under
    ``base`` (None: on free ports), wait until all are healthy, stop them all on exit.
    ``PortInUse`` when a port is taken."""
    pool = iter(ports)
    with _stopped_on_exit() as servers:
        for env in envs:
            port = default_port(env, base) if base is not None else None
            servers.append(
                start_server_process(
                    env,
                    host=host,
                    port=port,
                    extra_args=server_args,
                    log_path=_log(log_dir, env),
                    listener=bind_first(host, pool, env) if ports else None,
                )
            )
        _wait_all(servers, timeout)
        yield servers


@contextlib.contextmanager
def serve_fleet(
    replicas: dict[str, int],
    host: str = "127.0.0.1",
    log_dir: str | None = None,
    timeout: float = 180.0,
    gateway_port: int = BASE_PORT,
    server_args: list[str] | None = None,
    replica_ports: Sequence[int] = (),
) -> Iterator[list[ServerProcess]]:
    """Start ``replicas[env]`` server processes per env (each on the next free one of
    ``replica_ports``, else on a free port; with ``server_args`` as in
    :func:`serve_processes`) and a gateway in
    front of them on ``gateway_port``; the gateway comes last in the yielded list.
    Waits until all are healthy, stops them all on exit. ``PortInUse`` when the gateway's
    port is taken (checked first, before any replica starts)."""
    # The gateway's port is bound first and held, so nobody takes it while the replicas start.
    with (
        _stopped_on_exit() as servers,
        contextlib.closing(bind_listener(host, gateway_port, "the gateway")) as gateway,
    ):
        pool = iter(replica_ports)
        for env, count in replicas.items():
            for i in range(1, count + 1):
                servers.append(
                    start_server_process(
                        env,
                        host=host,
                        extra_args=server_args,
                        log_path=_log(log_dir, f"{env}-{i}"),
                        listener=bind_first(host, pool, env) if replica_ports else None,
                    )
                )
        _wait_all(servers, timeout)
        urls = {env: [s.url for s in servers if s.env == env] for env in replicas}
        servers.append(
            start_gateway_process(urls, host=host, log_path=_log(log_dir, "gateway"), listener=gateway)
        )
        _wait_all(servers[-1:], timeout)
        yield servers


@dataclass
class _Restart:
    """One supervised server's restart state."""

    backoff: float
    due: float | None = None
    """When the next start is due (None while the process runs)."""
    started: float = field(default_factory=time.monotonic)


class Supervisor:
    """Keeps started servers running: a process that exits is reported and started again
    on the same port (so its URL, and the gateway's replica list, stay valid) after a
    backoff that doubles per crash up to ``max_backoff`` and resets once the process has
    stayed up ``stable_after`` seconds. Call :meth:`poll` periodically; it never blocks."""

    def __init__(
        self,
        servers: list[ServerProcess],
        min_backoff: float = 1.0,
        max_backoff: float = 30.0,
        stable_after: float = 60.0,
    ) -> None:
        self.servers = servers
        self.min_backoff, self.max_backoff, self.stable_after = min_backoff, max_backoff, stable_after
        self._state = {id(s): _Restart(min_backoff) for s in servers}
        self.restarts = 0

    def poll(self) -> list[str]:
        """Check every server once; what happened, one line per event."""
        return [event for server in self.servers if (event := self._check(server, self._state[id(server)]))]

    def _check(self, server: ServerProcess, state: _Restart) -> str | None:
        now, code = time.monotonic(), server.process.poll()
        if code is None:
            if now - state.started > self.stable_after:
                state.backoff = self.min_backoff
            return None
        if state.due is None:
            state.due = now + state.backoff
            return f"{server.env} at {server.url} (pid {server.process.pid}) exited with code {code}; restarting in {state.backoff:g}s"
        if now < state.due:
            return None
        state.backoff = min(state.backoff * 2, self.max_backoff)
        try:
            server.restart()
        except PortInUse as exc:  # another process took the port while the server was down
            state.due = now + state.backoff
            return f"{server.env} not restarted: {exc}; trying again in {state.backoff:g}s"
        self.restarts += 1
        state.due, state.started = None, now
        return f"{server.env} restarted at {server.url} (pid {server.process.pid})"


@contextlib.contextmanager
def _stopped_on_exit() -> Iterator[list[ServerProcess]]:
    """A list to put started servers in; all are stopped on exit, the last started first
    (so a gateway goes before its replicas)."""
    servers: list[ServerProcess] = []
    try:
        yield servers
    finally:
        for server in reversed(servers):
            server.stop()


def _wait_all(servers: list[ServerProcess], timeout: float) -> None:
    for server in servers:
        wait_healthy(server.url, timeout, server.process)


def _log(log_dir: str | None, name: str) -> str | None:
    return os.path.join(log_dir, f"{name}.log") if log_dir else None


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux for SIGTERM when the parent dies, so a server
    never outlives a launcher killed with SIGKILL (no-op elsewhere); and take SIGINT back,
    which :meth:`ServerProcess.stop` sends: a launcher started in the background by a shell
    inherits SIGINT ignored, and so would its children."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1
