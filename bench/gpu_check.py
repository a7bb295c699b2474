"""The GPU plan in one command: the kit installed, then the micro-benchmarks
(``bench/gpu.py``), the whole training loop (``bench/gpu_loop.py``) and the CUDA-only tests,
each in its own process so that one failing leaves the others' figures; one summary.

    python3 bench/gpu_check.py --kit runs/gpu-kit --out runs/gpu-check   # on the device (make gpu-check)
    python bench/gpu_check.py --kit KIT --device cpu --tiny --phases loop,tests   # the CPU twin (CI)

Writes ``OUT/gpu-micro.json``, ``OUT/gpu-loop.json`` (the loop's run folders and logs go to
``--work``) and ``OUT/gpu-check.json`` (each phase's exit code and seconds); exits 1 when a
phase failed. Device facts and figures: ``docs/gpu.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gpu_kit

BENCH = Path(__file__).resolve().parent
CUDA_TESTS = ["tests/test_trainer_recipes.py", "tests/test_slots.py", "-k", "cuda"]
"""The tests the suite skips without a CUDA device."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kit", type=Path, required=True, help="a folder from `make gpu-kit`")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="the micro-benchmarks' short plan")
    parser.add_argument("--tiny", action="store_true", help="toy shapes: the CPU twin")
    parser.add_argument("--phases", default="micro,loop,tests", help="comma-separated: micro, loop, tests")
    parser.add_argument("--work", type=Path, default=Path("runs/gpu-loop"), help="the loop's run folders")
    parser.add_argument("--phase-timeout", type=float, default=420.0, help="seconds a phase may take")
    args = parser.parse_args()
    started = time.perf_counter()
    site = gpu_kit.activate(args.kit)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    commands = phase_commands(args, out)
    summary = {"kit": str(site), "phases": {}}
    for phase in args.phases.split(","):
        if phase not in commands:
            raise SystemExit(f"no phase {phase!r}: pick from {', '.join(commands)}")
        summary["phases"][phase] = run_phase(phase, commands[phase], args.kit, args.phase_timeout)
    summary["wall_s"] = round(time.perf_counter() - started, 1)
    (out / "gpu-check.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["phases"]), f"in {summary['wall_s']} s; wrote {out / 'gpu-check.json'}")
    if any(p["exit"] for p in summary["phases"].values()):
        raise SystemExit(1)


def phase_commands(args: argparse.Namespace, out: Path) -> dict[str, list[str]]:
    tokenizer = str((args.kit / "tokenizer").resolve())
    device = ["--device", args.device] + (["--tiny"] if args.tiny else [])
    micro = [str(BENCH / "gpu.py"), "--tokenizer", tokenizer, "--out", str(out / "gpu-micro.json"), *device]
    loop = [str(BENCH / "gpu_loop.py"), "--tokenizer", tokenizer, "--work", str(args.work.resolve()), *device]
    # -P: the working directory (the repository root) stays off sys.path, so `agentgym` is the
    # installed one, with envs/, servers/ and trainers/ mapped in.
    tests = ["-P", "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *CUDA_TESTS]
    return {
        "micro": [*micro, *(["--quick"] if args.quick else [])],
        "loop": [*loop, "--out", str(out / "gpu-loop.json")],
        "tests": tests,
    }


def run_phase(phase: str, arguments: list[str], kit: Path, timeout: float) -> dict[str, float | int]:
    """One phase in its own Python, its output passed through; exit code (124: stopped after
    ``timeout`` seconds, so that the next phase still runs) and seconds."""
    print(f"== {phase}: {' '.join(arguments)}", flush=True)
    env = dict(os.environ, AGENTGYM_TEST_TOKENIZER=str((kit / "tokenizer").resolve()))
    started = time.perf_counter()
    with subprocess.Popen([sys.executable, *arguments], env=env) as process:
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = 124
    return {"exit": code, "seconds": round(time.perf_counter() - started, 1)}


if __name__ == "__main__":
    main()
