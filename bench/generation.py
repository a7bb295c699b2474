"""Generation tokens/s at many concurrent replies: the continuous batcher the trainer uses
(static slots, decode steps replayed as CUDA graphs on a GPU; eager slots for comparison)
against plain ``model.generate`` with a static cache, in one process on one model.

    python bench/generation.py --device cpu --replies 8 --tokens 32     # the default model here
    python bench/generation.py --model FOLDER --device cuda --replies 8 64 256

``bench/gpu.py`` calls :func:`generation_rows` for each of its shapes. Rows are sampled at
temperature 1 with no seed (as rollouts are), every reply ``--tokens`` long unless it ends;
the rate is sampled tokens over wall time, the median of ``--repeats`` rounds after one
warm-up round (CUDA graphs are captured there).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

from agentgym.policies.base import SamplingParams
from agentgym.policies.batching import ContinuousBatcher
from agentgym.policies.hf import HFPolicy
from agentgym.policies.live_batch import left_padded


def prompts(policy: HFPolicy, replies: int) -> list[list[int]]:
    """One short chat prompt per reply, each different."""
    return [
        policy.prompt_ids([{"role": "user", "content": f"Describe room {i} and what to do there."}])
        for i in range(replies)
    ]


def median_rate(round_: Any, device: torch.device, repeats: int) -> float:
    """Median tokens/s of ``repeats`` calls of ``round_`` (which returns tokens sampled) after a warm-up."""
    round_()
    rates = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        tokens = round_()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        rates.append(tokens / (time.perf_counter() - started))
    return round(statistics.median(rates), 1)


def batcher_rate(
    policy: HFPolicy, ids: list[list[int]], new_tokens: int, repeats: int, **options: Any
) -> float:
    """Tokens/s of every prompt at once through a :class:`ContinuousBatcher` as wide as them."""
    batcher = ContinuousBatcher(
        policy.model, policy.tokenizer, policy.stop_ids, max_batch_size=len(ids), batch_wait_s=0.05, **options
    )
    sampling = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)

    def round_() -> int:
        futures = [batcher.submit(prompt, sampling) for prompt in ids]
        return sum(len(future.result(timeout=600).token_ids) for future in futures)

    try:
        return median_rate(round_, policy.device, repeats)
    finally:
        batcher.close()


def generate_rate(policy: HFPolicy, ids: list[list[int]], new_tokens: int, repeats: int) -> float:
    """Tokens/s of plain ``model.generate`` over the left-padded prompts with a static cache."""
    pad = policy.tokenizer.pad_token_id if policy.tokenizer.pad_token_id is not None else 0
    batch, mask = (tensor.to(policy.device) for tensor in left_padded(ids, pad))
    width = batch.shape[1]

    def round_() -> int:
        with torch.inference_mode():
            out = policy.model.generate(
                batch,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                cache_implementation="static",
                pad_token_id=pad,
            )
        return (out.shape[1] - width) * len(ids)

    return median_rate(round_, policy.device, repeats)


def generation_rows(
    policy: HFPolicy, shape: str, replies: list[int], new_tokens: int, repeats: int = 3
) -> list[dict[str, Any]]:
    """One row per reply count: the batcher with CUDA graphs (on CUDA; eager also at the
    first count) or eager (elsewhere), and plain ``generate`` with a static cache, tokens/s."""
    rows = []
    for count in replies:
        ids = prompts(policy, count)
        row: dict[str, Any] = {"shape": shape, "replies": count, "new_tokens": new_tokens}
        if policy.device.type == "cuda":
            row["batcher_graphs_tokens_s"] = batcher_rate(policy, ids, new_tokens, repeats, cuda_graphs=True)
            if count == replies[0]:  # eager steps are launch-bound: one row to compare, not minutes
                row["batcher_eager_tokens_s"] = batcher_rate(
                    policy, ids, new_tokens, repeats, cuda_graphs=False
                )
        else:  # eager is all there is off CUDA (and this call also runs against older batchers)
            row["batcher_eager_tokens_s"] = batcher_rate(policy, ids, new_tokens, repeats)
        row["generate_static_tokens_s"] = generate_rate(policy, ids, new_tokens, repeats)
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--replies", type=int, nargs="+", default=[8])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    policy = HFPolicy(args.model, device=args.device, dtype=args.dtype)
    generation_rows(policy, args.model, args.replies, args.tokens, args.repeats)


if __name__ == "__main__":
    main()
