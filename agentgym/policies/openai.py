"""``OpenAIPolicy``: any OpenAI-compatible chat-completions endpoint (OpenAI, vLLM's
server, llama.cpp, our own :mod:`agentgym.policies.openai_server`) as a text policy.

Returns text only (no token ids or log-probs): fine for evaluation, not for training.
With ``tool_calls=True`` the model acts through OpenAI tool calls instead of writing the
agent format: each request carries ``tools`` (one function per action type of the commands
the env lists, :mod:`agentgym.agents.tools`) and ``tool_choice: "required"``; earlier turns
go back as assistant ``tool_calls`` answered by ``tool`` messages (the observations).
A request whose ``info["reply_choices"]`` lists the only replies allowed (a constrained
rollout) sends them as vLLM's ``structured_outputs: {"choice": [...]}``, which ``serve-model``
enforces token for token as the trainer does, and in ``vllm_xargs`` for a ``vllm serve``
started with our logits processor (:mod:`agentgym.policies.vllm_choices`), which does the
same there; a vLLM server without it holds the reply by its own choice backend.
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

from agentgym.agents.tools import ActionTools
from agentgym.policies.base import Generation, GenerationRequest, Message, SamplingParams
from agentgym.policies.vllm import CHOICE_TEXTS_ARG

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
        tool_calls: act through OpenAI tool calls (``tools=``) rather than the agent format.
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
        tool_calls: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.tool_calls = tool_calls
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

    def payload(
        self,
        messages: list[Message],
        sampling: SamplingParams,
        tools: ActionTools | None = None,
        choices: list[str] | None = None,
    ) -> dict[str, Any]:
        """The JSON body of one request: ``role`` and ``content`` of each message; with
        ``tools`` the tool definitions and earlier tool calls with their results; with
        ``choices`` the replies allowed, as vLLM's ``structured_outputs.choice``."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": tool_messages(messages)
            if tools
            else [{"role": m["role"], "content": m["content"]} for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if tools:
            body |= {"tools": tools.schemas(), "tool_choice": "required", "parallel_tool_calls": False}
        elif choices:
            # serve-model reads the first; a vLLM server started with our logits processor
            # holds the reply to the trainer's tokenization by the second (its own choice
            # backend, which the first asks for, allows any tokenization that spells one).
            body["structured_outputs"] = {"choice": list(choices)}
            body["vllm_xargs"] = {CHOICE_TEXTS_ARG: list(choices)}
        return body

    async def _complete(self, request: GenerationRequest, sampling: SamplingParams) -> Generation:
        client, semaphore = self._session()
        tools = ActionTools(request.info.get("available_actions")) if self.tool_calls else None
        async with semaphore:
            body = self.payload(request.messages, sampling, tools, request.info.get("reply_choices"))
            data = await self._post(client, body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            calls = choice["message"].get("tool_calls") or []
        except (KeyError, IndexError, TypeError, AttributeError) as exc:
            raise OpenAIError(f"malformed chat completion: {str(data)[:300]}") from exc
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        if not (tools and calls):
            return Generation(text=text, finish_reason=reason)
        try:
            name, arguments = calls[0]["function"]["name"], calls[0]["function"].get("arguments") or "{}"
            action = tools.command(name, arguments)
        except (KeyError, TypeError, ValueError) as exc:
            # A call the env has no command for is the model's mistake: a reply that does
            # not parse (an invalid turn with feedback), not a failed episode.
            return Generation(text=f"{text}\n(invalid tool call: {exc})".strip(), finish_reason=reason)
        return Generation(
            text=text,
            finish_reason=reason,
            tool_call={"name": name, "arguments": arguments, "action": action},
        )

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


def tool_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation in OpenAI's tool-calling shape: a reply made through a tool call
    (``message["tool_call"]``) becomes an assistant ``tool_calls`` message, and the
    observation after it the ``tool`` message answering that call."""
    wire: list[dict[str, Any]] = []
    pending: str | None = None
    for i, message in enumerate(messages):
        call = message.get("tool_call") if message["role"] == "assistant" else None
        if call:
            pending = f"call_{i}"
            function = {"name": call["name"], "arguments": call["arguments"]}
            wire.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": pending, "type": "function", "function": function}],
                }
            )
        elif pending and message["role"] == "user":
            wire.append({"role": "tool", "tool_call_id": pending, "content": message["content"]})
            pending = None
        else:
            wire.append({"role": message["role"], "content": message["content"]})
    return wire


def _retryable(status: int) -> bool:
    return status >= 500 or status in RETRY_STATUSES


def _describe(response: httpx.Response) -> str:
    """OpenAI's ``{"error": {"message"}}`` when present, else the start of the body."""
    try:
        message = response.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = response.text[:300]
    return f"HTTP {response.status_code} from {response.request.url}: {message}"
