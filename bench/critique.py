"""One critique round on held-out math problems with a real model as actor and critic:
prints Acc, Acc@Refine, Acc@Dis and the Δ figures (docs/algorithms/critique-rl.md).

    python bench/critique.py [--model smollm2-135m] [--problems 16] [--difficulty easy]
                             [--max-new-tokens 160] [--samples 1]

The default model untrained is a floor, not a result: it shows the protocol running end
to end on CPU. ``--samples k`` also samples k answers per problem and prints plain and
critique-filtered majority-vote accuracy. Figures go to bench/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from agentgym.envs.math import MathEnv
from agentgym.play.critique import critique_metrics, critique_round, voting_accuracy
from agentgym.policies.base import SamplingParams
from agentgym.policies.hf import HFPolicy


async def run(args: argparse.Namespace) -> dict[str, object]:
    env = MathEnv(n_train=0, n_test=args.problems, difficulty=args.difficulty)
    problems = [env.problem(task.task_id) for task in env.tasks("test")]
    policy = HFPolicy(args.model, max_batch_size=args.problems * args.samples)
    temperature = 0.0 if args.samples == 1 else 0.7  # voting needs different samples
    sampling = SamplingParams(temperature=temperature, max_new_tokens=args.max_new_tokens, seed=0)
    start = time.perf_counter()
    try:
        records = await critique_round(
            policy, policy, problems, sampling, n_answers=args.samples, key=MathEnv.answer_key
        )
    finally:
        await policy.close()
    figures: dict[str, object] = {
        "model": args.model,
        "problems": len(problems),
        "difficulty": args.difficulty,
        "wall_s": round(time.perf_counter() - start, 1),
        **critique_metrics(r.outcome for r in records),
    }
    if args.samples > 1:
        figures.update(voting_accuracy(records, MathEnv.answer_key))
    figures["example"] = {k: records[0].to_dict()[k] for k in ("answer", "critique", "refined")}
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--problems", type=int, default=16)
    parser.add_argument("--difficulty", default="easy")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--samples", type=int, default=1)
    figures = asyncio.run(run(parser.parse_args()))
    example = figures.pop("example")
    print(json.dumps(figures, indent=2))
    for name, generation in example.items():  # type: ignore[union-attr]
        print(f"\n--- {name} (problem 0) ---\n{generation['text']}")


if __name__ == "__main__":
    main()
