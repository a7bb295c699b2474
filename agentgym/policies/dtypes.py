"""The one dtype rule: the floating-point type a model is trained, played, served and
exported in. The trainer, :class:`~agentgym.policies.hf.HFPolicy` (so ``eval`` and
``serve-model``) and ``export`` all ask :func:`resolve_dtype` or :func:`export_dtype`:

1. An explicit choice wins: ``dtype:`` in a training config, ``--dtype`` on the command
   line, ``HFPolicy(dtype=...)``.
2. A trained model (a run folder, one of its checkpoints, or a folder ``export`` wrote)
   plays in the dtype its run trained and was evaluated in, read from its play record:
   it plays as it was scored.
3. Otherwise (``auto``): bfloat16 on a CUDA device that supports it and on a CPU that
   computes it natively (the ``avx512_bf16`` or ``amx_bf16`` flag), float32 elsewhere
   (emulated bf16 is slower than float32). On this project's AMD EPYC CPUs the default run
   trains 1.4x faster in bf16, and on validation it is within the protocol's interval of
   float32 (3 seeds, ``bench/RESULTS.md``). ``AGENTGYM_CPU_DTYPE`` overrides what ``auto``
   means on a CPU (the test suite sets ``float32``: its exactness checks are float32's).

Importing this module does not import torch: configs are checked without it.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

AUTO = "auto"
CPU_DTYPE_VARIABLE = "AGENTGYM_CPU_DTYPE"
"""The environment variable that says what ``auto`` means on a CPU."""
DTYPE_NAMES = ("bfloat16", "float16", "float32")
"""The dtypes a model is trained, played or exported in, by name."""


def check_dtype_name(name: str) -> str:
    """``name`` when it is ``auto`` or one of :data:`DTYPE_NAMES`; ValueError otherwise."""
    if name != AUTO and name not in DTYPE_NAMES:
        raise ValueError(f"unknown dtype {name!r}; choose {AUTO} or one of {', '.join(DTYPE_NAMES)}")
    return name


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``."""
    return str(dtype).removeprefix("torch.")


def resolve_dtype(requested: Any, device: Any, trained: str | None = None) -> torch.dtype:
    """The dtype to load a model in on ``device`` (a ``torch.device`` or its name):
    ``requested`` (a torch dtype or its name) unless it is None or ``auto``; then
    ``trained``, the dtype a trained model's run recorded; then the device's default."""
    import torch

    if isinstance(requested, torch.dtype):
        return requested
    if requested not in (None, AUTO):
        return getattr(torch, check_dtype_name(requested))
    if trained is not None:
        return getattr(torch, check_dtype_name(trained))
    return device_default(torch.device(device))


def device_default(device: torch.device) -> torch.dtype:
    """bfloat16 on a CUDA device or CPU that computes in it, float32 elsewhere (rule 3)."""
    import torch

    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    if device.type != "cpu":
        return torch.float32
    chosen = os.environ.get(CPU_DTYPE_VARIABLE) or AUTO
    return cpu_default() if chosen == AUTO else getattr(torch, check_dtype_name(chosen))


def cpu_default() -> torch.dtype:
    """bfloat16 where this CPU computes it natively (Linux's CPU flags), float32 elsewhere."""
    import torch

    return torch.bfloat16 if native_bf16_cpu() else torch.float32


@functools.cache
def native_bf16_cpu() -> bool:
    """Whether the CPU has bf16 instructions (x86 ``avx512_bf16`` or ``amx_bf16``)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


def export_dtype(requested: str | None, trained: str | None) -> str:
    """The dtype ``export`` writes: ``requested`` unless None or ``auto``; then the dtype the
    run trained in; float32 for a run that did not record it (lossless whatever it was)."""
    if requested not in (None, AUTO):
        return check_dtype_name(requested)
    return check_dtype_name(trained) if trained is not None else "float32"
