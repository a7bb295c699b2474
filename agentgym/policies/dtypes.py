"""The one dtype rule: the floating-point type a model is trained, played, served and
exported in. The trainer, :class:`~agentgym.policies.hf.HFPolicy` (so ``eval`` and
``serve-model``) and ``export`` all ask :func:`resolve_dtype` or :func:`export_dtype`:

1. An explicit choice wins: ``dtype:`` in a training config, ``--dtype`` on the command
   line, ``HFPolicy(dtype=...)``.
2. A trained model (a run folder, one of its checkpoints, or a folder ``export`` wrote)
   plays in the dtype its run trained and was evaluated in, read from its play record:
   it plays as it was scored.
3. Otherwise (``auto``): bfloat16 on a CUDA device that supports it, float32 elsewhere.
   On this project's AMD EPYC CPUs (``avx512_bf16``) bf16 updates and generation measure
   1.3-1.75x faster (``bench/RESULTS.md``), but whether a run learns as well in bf16 has
   not been measured under the evaluation protocol, so CPU stays float32 until it is.

Importing this module does not import torch: configs are checked without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

AUTO = "auto"
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
    """bfloat16 on a CUDA device that computes in it, float32 elsewhere (rule 3)."""
    import torch

    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def export_dtype(requested: str | None, trained: str | None) -> str:
    """The dtype ``export`` writes: ``requested`` unless None or ``auto``; then the dtype the
    run trained in; float32 for a run that did not record it (lossless whatever it was)."""
    if requested not in (None, AUTO):
        return check_dtype_name(requested)
    return check_dtype_name(trained) if trained is not None else "float32"
