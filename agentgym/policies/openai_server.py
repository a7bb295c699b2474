"""An OpenAI-compatible chat-completions server over any policy (usually a local
:class:`~agentgym.policies.hf.HFPolicy`).

How to expose a local model (or a training run: its newest checkpoint, LoRA merged) to
third-party agents, and what the ``openai`` policy is tested against::

    agentgym serve-model --model smollm2-135m --port 8200      # or --model runs/<run>
    curl http://127.0.0.1:8200/v1/chat/completions -H 'content-type: application/json' \\
         -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 20}'

Routes: ``POST /v1/chat/completions`` (no streaming; ``tools`` and ``tool_choice`` as
OpenAI's, answered with ``tool_calls``: :mod:`agentgym.policies.tool_calls`; vLLM's
``structured_outputs: {"choice": [...]}`` holds the reply to one of the given texts, by the
trainer's own constrained decoding), ``GET /v1/models``,
``GET /health``. Concurrent requests share the policy's batches. Errors use OpenAI's
shape, ``{"error": {"message", "type", "param", "code"}}``: 400 for a body that is not a
JSON object or a request the model cannot take, 422 for schema errors, 401 for a
missing or wrong key when the server has one.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
import uuid
from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

from fastapi import FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from agentgym.policies.base import Generation, GenerationRequest, Message, Policy, SamplingParams
from agentgym.policies.tool_calls import forced_prefix, function_names, parse_reply, render_call, tool_prompt
from agentgym.servers.middleware import BodySizeLimitMiddleware

log = logging.getLogger(__name__)

DEFAULT_MAX_TOKENS = 256
"""Reply length when a request sets neither ``max_tokens`` nor ``max_completion_tokens``."""
MAX_BODY_BYTES = 8 * 2**20
"""Request bodies past this are refused (413) before they are read whole."""
DISCONNECT_POLL_S = 0.25
"""How often a generating request checks that its client is still there."""
SHUTDOWN_GRACE_S = 10
"""On SIGTERM, how long requests still generating may take before the server stops anyway
(``serve-model --shutdown-grace``)."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
T = TypeVar("T")


class CompatError(Exception):
    """An error answered in OpenAI's shape."""

    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.kind, "param": self.param, "code": None}
        return JSONResponse({"error": error}, status_code=self.status)


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class FunctionCall(BaseModel):
    name: str
    arguments: str = "{}"
    """A JSON object, encoded as a string (OpenAI's wire shape)."""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] = Field(default_factory=dict)


class Tool(BaseModel):
    type: Literal["function"]
    function: FunctionDef


class FunctionName(BaseModel):
    name: str


class NamedToolChoice(BaseModel):
    type: Literal["function"]
    function: FunctionName


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    tool_calls: list[ToolCall] | None = None
    """An assistant turn's calls, rendered back in the shape the model writes them."""
    tool_call_id: str | None = None

    def to_message(self) -> Message:
        """Plain ``{"role", "content"}``: ``developer`` (OpenAI's newer name) becomes
        ``system``, a ``tool`` result a ``user`` turn, and calls join the content."""
        content = (
            self.content if isinstance(self.content, str) else "".join(p.text for p in self.content or [])
        )
        calls = [render_call(c.function.name, c.function.arguments) for c in self.tool_calls or []]
        role = {"developer": "system", "tool": "user"}.get(self.role, self.role)
        return {"role": role, "content": "\n".join(part for part in (content, *calls) if part)}


MAX_CHOICES = 1024
"""Replies a ``structured_outputs.choice`` list may name at most (an env lists far fewer)."""


class StructuredOutputs(BaseModel):
    """vLLM's request field for constrained output; this server takes its ``choice`` only."""

    model_config = ConfigDict(extra="forbid")

    choice: list[Annotated[str, Field(min_length=1, max_length=4096)]] = Field(
        min_length=1, max_length=MAX_CHOICES
    )
    """The reply must be one of these, token for token as the trainer's constrained
    decoding makes it (each choice tokenized alone, then the end of turn)."""


class ChatCompletionRequest(BaseModel):
    # Clients send fields we do not use (user, presence_penalty, ...); ignore them as vLLM does.
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    """Ignored: the server has one model."""
    messages: list[ChatMessage] = Field(min_length=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=16)
    stream: bool = False
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """``None``: ``auto`` when there are tools."""
    parallel_tool_calls: bool | None = None
    """Accepted; a reply holds one call at most."""
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """Accepted in OpenAI's range and ignored: this server samples without penalties."""
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    """Accepted in OpenAI's range and ignored, as ``frequency_penalty``."""
    logit_bias: dict[str, float] | None = None
    """Refused when not empty: this server cannot bias tokens."""
    logprobs: bool = False
    """Refused when true: replies carry no log-probs here."""
    structured_outputs: StructuredOutputs | None = None
    guided_choice: list[str] | None = Field(None, min_length=1, max_length=MAX_CHOICES)
    """vLLM's earlier name for ``structured_outputs.choice``."""

    def check_supported(self) -> None:
        """CompatError for what changes sampling in a way this server cannot honour."""
        if self.logit_bias:
            raise CompatError(400, "logit_bias is not supported by this server", param="logit_bias")
        if self.logprobs:
            raise CompatError(400, "logprobs are not supported by this server", param="logprobs")

    def reply_limit(self, prompt_tokens: int, window: int | None, cap: int | None) -> int:
        """The reply's length at most: ``max_completion_tokens`` or ``max_tokens`` when given,
        else :data:`DEFAULT_MAX_TOKENS`, within the context left after the prompt and the
        server's ``cap``. CompatError (400) for a prompt that fills the context or a length
        asked beyond the room (as vLLM answers), before any tensor is built."""
        room = None if window is None else window - prompt_tokens
        if room is not None and room < 1:
            raise CompatError(
                400,
                f"the prompt is {prompt_tokens} tokens; the model reads {window} at most",
                param="messages",
            )
        limits = [limit for limit in (room, cap) if limit is not None]
        asked = self.max_completion_tokens or self.max_tokens
        if asked is None:
            return min([DEFAULT_MAX_TOKENS, *limits])
        if limits and asked > min(limits):
            why = (
                f"the {room} tokens the context leaves after a {prompt_tokens}-token prompt"
                if room == min(limits)
                else f"this server's cap, {cap}"
            )
            name = "max_completion_tokens" if self.max_completion_tokens else "max_tokens"
            raise CompatError(400, f"{name} {asked} is more than {why}", param=name)
        return asked

    def reply_choices(self, tools: list[dict[str, Any]]) -> list[str] | None:
        """The replies the model is held to (None: it decodes freely); CompatError where
        the request asks for constraints it cannot combine (with the ``tools`` it may call)."""
        if self.structured_outputs is not None and self.guided_choice is not None:
            raise CompatError(
                400, "give structured_outputs.choice or guided_choice, not both", param="guided_choice"
            )
        choices = self.structured_outputs.choice if self.structured_outputs else self.guided_choice
        if choices and tools:
            raise CompatError(400, "structured_outputs.choice and tools cannot be combined", param="tools")
        return choices

    def active_tools(self) -> list[dict[str, Any]]:
        """The tools the model may call ([] without tools or with ``tool_choice: "none"``);
        CompatError for a choice that names no given tool or requires one of none."""
        tools = [tool.model_dump() for tool in self.tools or []]
        choice = self.choice()
        if choice not in (None, "none", "auto") and not tools:
            raise CompatError(400, "tool_choice needs tools", param="tool_choice")
        if isinstance(choice, dict) and choice["function"]["name"] not in function_names(tools):
            raise CompatError(
                400, f"tool_choice names no given tool: {choice['function']['name']}", param="tool_choice"
            )
        return [] if choice == "none" else tools

    def choice(self) -> str | dict[str, Any] | None:
        return (
            self.tool_choice.model_dump()
            if isinstance(self.tool_choice, NamedToolChoice)
            else self.tool_choice
        )

    def sampling(self, max_new_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            temperature=self.temperature,
            top_p=self.top_p,
            max_new_tokens=max_new_tokens,
            stop=tuple(stop),
            seed=self.seed,
        )


def create_openai_app(
    policy: Policy,
    *,
    model_name: str | None = None,
    api_key: str | None = None,
    max_tokens: int | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """A FastAPI app answering chat completions with ``policy``. The caller owns the policy
    (and closes it). ``api_key``, when set, is required as ``Authorization: Bearer``;
    ``max_tokens`` caps every reply (None: the context the prompt leaves); a body past
    ``max_body_bytes`` is refused (413) before it is read whole."""
    served = model_name or policy.name
    window: int | None = getattr(policy, "context_window", None)
    app = FastAPI(title=f"AgentGym OpenAI-compatible server: {served}")
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_body_bytes)
    _install_error_handlers(app)

    def check_key(authorization: str | None) -> None:
        if api_key and not hmac.compare_digest(authorization or "", f"Bearer {api_key}"):
            raise CompatError(401, "missing or wrong API key", "authentication_error")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": served}

    @app.get("/v1/models")
    async def models(authorization: str | None = Header(None)) -> dict[str, Any]:
        check_key(authorization)
        return {
            "object": "list",
            "data": [{"id": served, "object": "model", "created": 0, "owned_by": "agentgym"}],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(
        body: ChatCompletionRequest, request: Request, authorization: str | None = Header(None)
    ) -> dict[str, Any]:
        check_key(authorization)
        if body.stream:
            raise CompatError(400, "stream=true is not supported by this server", param="stream")
        body.check_supported()
        tools = body.active_tools()
        info = {"reply_choices": allowed} if (allowed := body.reply_choices(tools)) else {}
        if info and not getattr(policy, "constrains", False):
            raise CompatError(400, f"{served} cannot constrain its replies", param="structured_outputs")
        messages = [m.to_message() for m in body.messages]
        if tools:
            messages = _with_system(messages, tool_prompt(tools, body.choice()))
        prompt_ids = _prompt_ids(policy, messages)
        prefix = forced_prefix(body.choice()) if tools and prompt_ids is not None else ""
        if prefix:  # the reply starts as a call: token policies continue from there
            prompt_ids = prompt_ids + policy.tokenizer.encode(prefix, add_special_tokens=False)
        # A text policy counts no tokens: no context to check, only the server's cap.
        counted = prompt_ids is not None
        limit = body.reply_limit(len(prompt_ids) if counted else 0, window if counted else None, max_tokens)
        requests = [GenerationRequest(messages, prompt_ids, info) for _ in range(body.n)]
        sampling = body.sampling(limit)
        try:
            generations = await until_disconnected(request, policy.generate(requests, sampling))
        except ValueError as exc:  # the policy refused the request (e.g. an empty prompt)
            raise CompatError(400, str(exc)) from exc
        names = function_names(tools)
        choices = [{"index": i, **_choice(g, prefix, names)} for i, g in enumerate(generations)]
        completion_tokens = sum(len(g.token_ids or []) for g in generations)
        prompt_tokens = len(prompt_ids or [])
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": served,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    return app


async def until_disconnected(request: Request, generation: Awaitable[T]) -> T:
    """``generation``'s result; if the client hangs up first, the generation is cancelled
    (the policy stops sampling for it) and the handler ends."""
    task = asyncio.ensure_future(generation)

    async def hung_up() -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(DISCONNECT_POLL_S)

    watch = asyncio.ensure_future(hung_up())
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    return await task


def _choice(generation: Generation, prefix: str, names: list[str]) -> dict[str, Any]:
    """A choice's ``message`` and ``finish_reason``; with tools, a call in the reply becomes
    ``tool_calls`` (finish reason ``tool_calls``)."""
    content, calls = parse_reply(prefix + generation.text, names) if names else (generation.text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {"message": message, "finish_reason": "tool_calls" if calls else generation.finish_reason}


def _with_system(messages: list[Message], text: str) -> list[Message]:
    """``text`` appended to the system message (one is added first when there is none)."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _prompt_ids(policy: Policy, messages: list[Message]) -> list[int] | None:
    """Token-level policies get the templated prompt (tokenized once, also counted for
    ``usage``); a template that rejects the conversation is the client's error."""
    prompt_ids = getattr(policy, "prompt_ids", None)
    if prompt_ids is None:
        return None
    try:
        return prompt_ids(messages)
    except Exception as exc:  # jinja raises TemplateError for e.g. an unsupported role order
        raise CompatError(
            400, f"the model's chat template rejected the messages: {exc}", param="messages"
        ) from exc


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CompatError)
    async def on_compat_error(_: Request, exc: CompatError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        loc = [str(part) for part in first.get("loc", ()) if part != "body"]
        if first.get("type") == "json_invalid" or (not loc and first.get("type") != "missing"):
            return CompatError(400, "the request body is not a JSON object").response()
        message = "; ".join(
            f"{'.'.join(map(str, e.get('loc', ())[1:])) or 'body'}: {e['msg']}" for e in errors
        )
        return CompatError(422, message, param=".".join(loc) or None).response()

    @app.exception_handler(StarletteHTTPException)
    async def on_http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return CompatError(exc.status_code, str(exc.detail), kind).response()

    @app.exception_handler(Exception)
    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("chat completion failed")  # the details stay in the server's log
        return CompatError(
            500, "internal error (the server's log has the details)", "server_error"
        ).response()


def serve_model(
    model: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8200,
    device: str | None = None,
    dtype: str | None = None,
    max_batch_size: int = 8,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_tokens: int | None = None,
    shutdown_grace_s: float = SHUTDOWN_GRACE_S,
) -> None:
    """Load ``model`` (alias, folder, hub id or training run) and serve it until Ctrl-C or
    SIGTERM (requests still generating get ``shutdown_grace_s`` to finish)."""
    import uvicorn

    from agentgym.policies.hf import HFPolicy

    if api_key is None and host not in LOOPBACK:
        log.warning("serving on %s without --api-key: anyone who reaches it can use the model", host)
    policy = HFPolicy(model, device=device, dtype=dtype, max_batch_size=max_batch_size)
    app = create_openai_app(policy, model_name=served_model_name, api_key=api_key, max_tokens=max_tokens)
    try:
        uvicorn.run(app, host=host, port=port, timeout_graceful_shutdown=shutdown_grace_s)
    finally:
        asyncio.run(policy.close())
