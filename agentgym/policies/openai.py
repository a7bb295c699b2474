"""``OpenAIPolicy``: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM's
server, llama.cpp, our own :mod:`agentgym.servers.openai_compat`) as a text policy.

Returns text only (no token ids or log-probs): fine for evaluation, not for training.
Each request is one HTTP call; at most ``concurrency`` are in flight. 429, 5xx and
connection errors are retried with exponential backoff (honouring ``Retry-After``);
other errors raise :class:`OpenAIError` at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
from typing import Any

import httpx

from agentgym.policies.base import Generation, GenerationRequest, Message, SamplingParams

RETRY_STATUSES = frozenset({408, 409, 429})
"""Besides every 5xx, the statuses OpenAI's own client retries: timeout, conflict, rate limit."""


class OpenAIError(RuntimeError):
    """The endpoint refused a request (or kept failing through every retry)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class OpenAIPolicy:
    """A chat-completions endpoint behind the :class:`~agentgym.policies.base.Policy` interface.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8200/v1``.
        model: model name sent with every request.
        api_key: bearer token; defaults to ``$OPENAI_API_KEY`` (none sent when unset).
        concurrency: requests in flight at most.
        timeout: seconds per HTTP attempt.
        retries: extra attempts after the first, on retryable failures.
        backoff: first retry wait in seconds; doubles per retry (with jitter), capped at ``max_wait``.
        max_wait: longest wait between attempts, ``Retry-After`` included.
        name: recorded in trajectories; defaults to ``model``.
    """

    tokenizer = None

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        concurrency: int = 8,
        timeout: float = 120.0,
        retries: int = 4,
        backoff: float = 0.5,
        max_wait: float = 20.0,
        name: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.name = name or model
        self.concurrency = concurrency
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_wait = max_wait
        api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # An httpx client and a semaphore belong to one event loop; keep one pair per
        # loop so the policy also works across several ``asyncio.run`` calls.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """One chat completion per request, concurrently (same order as ``requests``)."""
        return list(await asyncio.gather(*(self._complete(request, sampling) for request in requests)))

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
        self._loop = self._client = self._semaphore = None

    def payload(self, messages: list[Message], sampling: SamplingParams) -> dict[str, Any]:
        """The JSON body of one request (only ``role`` and ``content`` of each message are sent)."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        return body

    async def _complete(self, request: GenerationRequest, sampling: SamplingParams) -> Generation:
        client, semaphore = self._session()
        async with semaphore:
            data = await self._post(client, self.payload(request.messages, sampling))
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise OpenAIError(f"malformed chat completion: {str(data)[:300]}") from exc
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(text=text, finish_reason=reason)

    async def _post(self, client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = await client.post("/chat/completions", json=body)
            except httpx.TransportError as exc:
                if last:
                    raise OpenAIError(f"{self.base_url} unreachable: {exc!r}") from exc
                await asyncio.sleep(self._wait(attempt, None))
                continue
            if response.status_code == 200:
                return response.json()
            if last or not _retryable(response.status_code):
                raise OpenAIError(_describe(response), response.status_code)
            await asyncio.sleep(self._wait(attempt, response.headers.get("retry-after")))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _wait(self, attempt: int, retry_after: str | None) -> float:
        """``Retry-After`` seconds when the server sent them (not an HTTP date), else backoff."""
        with contextlib.suppress(TypeError, ValueError):
            return min(float(retry_after), self.max_wait)  # type: ignore[arg-type]
        return min(self.max_wait, self.backoff * 2**attempt) * random.uniform(0.5, 1.0)

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._client is None or self._semaphore is None:
            self._loop = loop
            self._client = httpx.AsyncClient(
                base_url=self.base_url, headers=self._headers, timeout=self.timeout
            )
            self._semaphore = asyncio.Semaphore(self.concurrency)
        return self._client, self._semaphore


def _retryable(status: int) -> bool:
    return status >= 500 or status in RETRY_STATUSES


def _describe(response: httpx.Response) -> str:
    """OpenAI's ``{"error": {"message"}}`` when present, else the start of the body."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    return f"HTTP {response.status_code} from {response.request.url}: {message}"
