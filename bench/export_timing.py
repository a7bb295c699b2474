"""Where `agentgym export` spends its time, one call at a time (issue 60 item 8).

    python bench/export_timing.py RUN_DIR     # a training run with a checkpoint

Prints seconds for: imports, loading the base model with the trained weights merged in,
hashing the sources, writing the weights (float32) and the tokenizer."""

from __future__ import annotations

import sys
import tempfile
import time


def main(run: str) -> None:
    started = time.perf_counter()
    import torch

    from agentgym.policies.models import load_checkpoint
    from agentgym.policies.runs import find_checkpoint

    imported = time.perf_counter()
    loaded = load_checkpoint(find_checkpoint(run), spec=run)
    merged = time.perf_counter()
    loaded.source.describe()
    hashed = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        loaded.model.to(torch.float32).save_pretrained(folder, safe_serialization=True)
        saved = time.perf_counter()
        loaded.tokenizer.save_pretrained(folder)
        done = time.perf_counter()
    print(
        f"imports {imported - started:.1f} s, load + merge {merged - imported:.1f} s, "
        f"hash {hashed - merged:.1f} s, weights {saved - hashed:.1f} s, tokenizer {done - saved:.2f} s"
    )


if __name__ == "__main__":
    main(sys.argv[1])
