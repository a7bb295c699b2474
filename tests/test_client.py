"""Both clients against real servers: typed answers, the retry rules and the transport
errors they raise (httpx's types, whichever library carried the request)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest

from agentgym.clients.env_client import AsyncEnvClient, EnvClient, RetryPolicy
from agentgym.contract.errors import AtCapacity
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

FAST_RETRIES = RetryPolicy(attempts=3, backoff=0.01)


@pytest.fixture
def hangup_server() -> Iterator[tuple[str, list[bytes]]]:
    """A TCP server that reads each request's first bytes and hangs up without answering
    (a server that dies mid-request); yields its URL and the requests it received."""
    received: list[bytes] = []
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                received.append(connection.recv(65536))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", received
    stop.set()
    thread.join()
    listener.close()


def test_a_step_the_server_may_have_run_is_never_resent(hangup_server: tuple[str, list[bytes]]) -> None:
    url, received = hangup_server

    async def main() -> None:
        async with AsyncEnvClient(url, retry=FAST_RETRIES) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.step("some-session", "look")
            assert len(received) == 1  # sent once: the engine may have run it
            with pytest.raises(httpx.TransportError):
                await client.state("some-session")
            # A read is safe to repeat: resent (by our policy, and once more per try by aiohttp).
            assert len(received) >= 1 + FAST_RETRIES.attempts
            assert all(request.startswith(b"GET /sessions/some-session") for request in received[1:])

    asyncio.run(main())


def test_both_clients_raise_connect_error_for_a_closed_port() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    with EnvClient(dead, retry=FAST_RETRIES) as client, pytest.raises(httpx.ConnectError):
        client.health()

    async def main() -> None:
        async with AsyncEnvClient(dead, retry=FAST_RETRIES) as client:
            with pytest.raises(httpx.ConnectError):
                await client.health()

    asyncio.run(main())


def test_async_client_plays_waits_out_429_and_reads_typed_errors() -> None:
    async def main(url: str) -> None:
        async with AsyncEnvClient(url, retry=RetryPolicy(attempts=1)) as once, AsyncEnvClient(url) as patient:
            first = await once.create(split="test", index=0)
            step = await once.step(first.session_id, "look")
            assert step.info["turn"] == 1
            await once.create(split="test", index=1)
            with pytest.raises(AtCapacity) as refused:
                await once.create(split="test", index=2)
            assert refused.value.retry_after and refused.value.retry_after >= 1
            # The patient client retries the 429 after Retry-After; freeing a slot lets it in.
            waiting = asyncio.create_task(patient.create(split="test", index=2))
            await asyncio.sleep(0.3)
            assert not waiting.done()
            await once.delete(first.session_id)
            assert (await waiting).info["turn"] == 0

    with serve_in_thread(ServerConfig(env="textworld", max_sessions=2)) as url:
        asyncio.run(main(url))
