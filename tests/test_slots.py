"""The continuous batcher's static slots (``agentgym/policies/slots.py``) on a tiny Llama.

Rows that join, finish at different steps (their slots refilled by moving later rows
down) and outgrow the slots' first capacity must still get exactly the tokens and
log-probs a full forward without any cache gives. On a CUDA device the same replies must
come back with the decode steps replayed as CUDA graphs (the GPU check runs that test).
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch

from agentgym.policies.base import Generation, SamplingParams
from agentgym.policies.batching import ContinuousBatcher
from agentgym.policies.hf import HFPolicy
from agentgym.policies.slots import MIN_CAPACITY, SlotCache

PROMPT_LENGTHS = (5, 40, MIN_CAPACITY - 6, 17)
REPLY_LENGTHS = (3, 12, 24, 7)
"""Rows finish at different steps; the third outgrows the first capacity mid-batch."""


def _replies(
    policy: HFPolicy, **batcher_args: object
) -> tuple[list[list[int]], list[Generation], ContinuousBatcher]:
    rng = random.Random(0)
    prompts = [[rng.randrange(100, 4000) for _ in range(n)] for n in PROMPT_LENGTHS]
    batcher = ContinuousBatcher(
        policy.model, policy.tokenizer, policy.stop_ids, max_batch_size=4, batch_wait_s=0.5, **batcher_args
    )
    try:
        futures = [
            batcher.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=n))
            for prompt, n in zip(prompts, REPLY_LENGTHS, strict=True)
        ]
        return prompts, [future.result(timeout=120) for future in futures], batcher
    finally:
        batcher.close()


def _full_forward_logprobs(policy: HFPolicy, prompt: list[int], reply: list[int]) -> torch.Tensor:
    """``[len(reply), V]`` log-probs at each reply position, from one forward without a cache."""
    ids = torch.tensor([prompt + reply], device=policy.device)
    with torch.inference_mode():
        logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.float(), dim=-1)


def test_slotted_rows_get_what_a_full_forward_gives(tiny_model_dir: Path) -> None:
    policy = HFPolicy(str(tiny_model_dir), device="cpu", dtype="float32")
    prompts, replies, batcher = _replies(policy)
    assert isinstance(batcher.slots, SlotCache)
    assert batcher.stats.max_rows == 4 and batcher.stats.prefills == 1  # one live batch
    assert batcher.slots.capacity >= 2 * MIN_CAPACITY  # grew while rows were live
    assert sorted(len(r.token_ids) for r in replies) == sorted(REPLY_LENGTHS)
    for prompt, reply in zip(prompts, replies, strict=True):
        logp = _full_forward_logprobs(policy, prompt, reply.token_ids)
        chosen = logp.gather(-1, torch.tensor(reply.token_ids)[:, None]).squeeze(-1)
        assert reply.logprobs == pytest.approx(chosen.tolist(), abs=1e-4)
        assert (logp.max(dim=-1).values - chosen).max() < 1e-4  # greedy: the argmax, up to ties


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA graphs)")
def test_cuda_graph_decode_matches_eager_decode(tiny_model_dir: Path) -> None:
    policy = HFPolicy(str(tiny_model_dir), device="cuda", dtype="float32")
    _, graphed, batcher = _replies(policy, cuda_graphs=True)
    assert batcher.slots is not None and batcher.slots.graphs  # captured, not fallen back
    _, eager, _ = _replies(policy, cuda_graphs=False)
    for a, b in zip(graphed, eager, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
