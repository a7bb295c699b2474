"""One sampling step's time (``agentgym.policies.sampling.sample_next``): a batch of rows
over SmolLM2's vocabulary, unseeded (as rollouts sample) and seeded (as ``eval --seed``
does), on one CPU thread or a GPU.

    python bench/sampling.py                     # batches of 8, 32 and 64 rows on the CPU
    python bench/sampling.py --device cuda --rows 64 256

Each figure is the median over ``--repeats`` rounds of 20 steps, after a warm-up round
(``bench/generation.py``'s timer).
"""

from __future__ import annotations

import argparse

import torch
from generation import median_rate

from agentgym.policies.sampling import draw_keys, sample_next

VOCAB = 49152
"""SmolLM2's vocabulary."""


def step_ms(rows: int, seeded: bool, device: torch.device, repeats: int) -> float:
    """Milliseconds of one ``sample_next`` over ``rows`` rows of random logits."""
    logits = torch.randn(rows, VOCAB, device=device) * 3
    ones = torch.ones(rows, device=device)
    seeds = list(range(rows)) if seeded else [None] * rows

    def twenty_steps() -> int:
        for _ in range(20):
            sample_next(logits, ones, ones, draw_keys(seeds, [5] * rows, device))
        return 20

    return 1000 / median_rate(twenty_steps, device, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    for rows in args.rows:
        unseeded, seeded = (step_ms(rows, flag, device, args.repeats) for flag in (False, True))
        print(f"{rows} rows: unseeded {unseeded:.2f} ms, seeded {seeded:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
