"""Token text for the token view, from a tokenizer that is already on this machine.

The viewer never downloads or converts a model. It looks for a tokenizer, in order, at
the spec given on the command line, the run's ``config.yaml`` ``model`` and the record's
``policy``: a model alias whose converted folder is in the AgentGym model cache, a local
model folder, or a Hugging Face id in the local Hugging Face cache. When none is found,
tokens are shown as their ids (their log-probs and loss mask are still exact).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)


class TokenDecoder(Protocol):
    name: str
    """What the page says the tokens were decoded with."""

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text of each token on its own (special tokens kept)."""
        ...


class HFDecoder:
    """A Hugging Face tokenizer as a :class:`TokenDecoder`."""

    def __init__(self, name: str, tokenizer: Any) -> None:
        self.name, self.tokenizer = name, tokenizer

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return self.tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)


def local_model_folder(spec: str) -> Path | None:
    """Where ``spec``'s tokenizer is on disk without downloading or converting anything."""
    from agentgym.policies.models import converted_folder

    converted = converted_folder(spec)
    if converted is not None:
        return converted if (converted / "tokenizer_config.json").is_file() else None
    folder = Path(spec).expanduser()
    if folder.is_dir() and (folder / "tokenizer_config.json").is_file():
        return folder
    return None


@functools.lru_cache(maxsize=8)
def load_decoder(spec: str) -> HFDecoder | None:
    """A decoder for ``spec`` when its tokenizer is on this machine, else ``None`` (cached)."""
    try:
        folder = local_model_folder(spec)
        if folder is None and not _in_hf_cache(spec):
            return None
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder or spec), local_files_only=True)
        return HFDecoder(spec, tokenizer)
    except Exception as exc:  # any unloadable tokenizer means "show ids", never a failed page
        log.info("no tokenizer for %r: %s", spec, exc)
        return None


def _in_hf_cache(spec: str) -> bool:
    if "/" not in spec or Path(spec).exists():
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(spec, "tokenizer_config.json"), str)
