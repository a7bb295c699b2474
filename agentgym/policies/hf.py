"""``HFPolicy``: a local Hugging Face causal LM as a token-level policy.

Loads any model ``from_pretrained`` can (aliases like ``smollm2-135m`` resolve to a
converted cache folder, see :mod:`agentgym.policies.models`), or a training run folder or
checkpoint (its base model with the trained weights merged in), and answers concurrent
``generate`` calls through a :class:`~agentgym.policies.batching.ContinuousBatcher`.
Every reply carries its sampled token ids (end-of-turn token included) and one
behaviour log-prob per token, ``log_softmax(logits / T)[token]``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping

import torch

from agentgym.policies.base import Generation, GenerationRequest, Message, SamplingParams
from agentgym.policies.batching import BatcherStats, ContinuousBatcher
from agentgym.policies.chat import chat_prompt_ids, choice_ids, end_of_turn_id, stop_token_ids
from agentgym.policies.dtypes import resolve_dtype
from agentgym.policies.models import DEFAULT_MODEL, LoadedModel, ModelSource, load_causal_lm
from agentgym.policies.runs import trained_dtype
from agentgym.policies.sampling import token_logprobs


class HFPolicy:
    """A transformers model behind the :class:`~agentgym.policies.base.Policy` interface.

    Args:
        model: alias (``smollm2-135m``), ``.gguf`` file, local folder, training run folder
            (or one of its ``checkpoints/step-N``) or Hugging Face id.
        device: ``"cuda"`` when available, else ``"cpu"``.
        dtype: torch dtype or its name; None or ``auto``: a trained model's own dtype,
            else bf16 on GPU and fp32 on CPU (:mod:`agentgym.policies.dtypes`).
        max_batch_size: requests decoded together at most.
        batch_wait_ms: how long an idle model waits after a request for others to batch with.
        prefix_cache: encoded prompts (and replies) kept so a later prompt that starts with
            one encodes only its new tokens; default 4 × ``max_batch_size``, 0 turns it off.
        name: recorded in trajectories; defaults to ``model``.
    """

    constrains = True
    """Decodes under ``info["reply_choices"]`` (token-level action masking)."""

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        device: str | None = None,
        dtype: torch.dtype | str | None = None,
        max_batch_size: int = 8,
        batch_wait_ms: float = 5.0,
        prefix_cache: int | None = None,
        name: str | None = None,
    ) -> None:
        device_ = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        loaded = load_causal_lm(
            model, dtype=resolve_dtype(dtype, device_, trained_dtype(model)), device=str(device_)
        )
        self._attach(loaded, name or model, max_batch_size, batch_wait_ms, prefix_cache)

    @classmethod
    def around(
        cls, loaded: LoadedModel, name: str, *, max_batch_size: int = 8, batch_wait_ms: float = 5.0
    ) -> HFPolicy:
        """A policy that plays ``loaded.model`` as it is, sharing its weights: another
        engine's model in training (TRL's), whose every optimizer step it then samples from.
        Whoever changes the weights sets :attr:`weights_version` before the next sample."""
        policy = cls.__new__(cls)
        policy._attach(loaded, name, max_batch_size, batch_wait_ms, None)
        return policy

    def _attach(
        self,
        loaded: LoadedModel,
        name: str,
        max_batch_size: int,
        batch_wait_ms: float,
        prefix_cache: int | None,
    ) -> None:
        self.name = name
        self.tokenizer, self.model = loaded.tokenizer, loaded.model
        self.device = self.model.device
        self.source: ModelSource = loaded.source
        """Where the weights came from (``source.describe()`` hashes them for results files)."""
        self.stop_ids = stop_token_ids(self.tokenizer, self.model.generation_config)
        self.end_id = end_of_turn_id(self.tokenizer)
        self.context_window: int | None = getattr(self.model.config, "max_position_embeddings", None)
        """Tokens the model attends to at most; rollouts end an episode before passing it."""
        self._batcher = ContinuousBatcher(
            self.model,
            self.tokenizer,
            self.stop_ids,
            max_batch_size=max_batch_size,
            batch_wait_s=batch_wait_ms / 1000,
            max_positions=self.context_window,
            prefix_cache=prefix_cache,
        )

    @property
    def prefix_cache(self) -> int:
        """Encoded sequences kept for reuse (0: reuse is off)."""
        return self._batcher.prefixes.capacity

    @property
    def stats(self) -> BatcherStats:
        """Prefill/decode forward counts and answered requests since construction."""
        return self._batcher.stats

    @property
    def weights_lock(self) -> threading.Lock:
        """Held around every forward pass; hold it while changing ``self.model`` in place
        (an optimizer step) so no decode step sees half-updated weights."""
        return self._batcher.lock

    @property
    def weights_version(self) -> int:
        """The version of the current weights, recorded on every token sampled with them
        (``Generation.versions``); :meth:`update_weights` bumps or sets it."""
        return self._batcher.version

    @weights_version.setter
    def weights_version(self, version: int) -> None:
        """The trainer sets it after changing the weights in place, before the policy
        samples again; the setter takes :attr:`weights_lock`."""
        with self.weights_lock:
            self._batcher.version = version

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The chat template applied to ``messages``, ending with the assistant's turn header."""
        return chat_prompt_ids(self.tokenizer, messages)

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """Answer every request (same order). Each request joins the live batch on its own,
        so concurrent calls share forwards and a short reply returns as soon as it ends."""
        choices = [choice_ids(self.tokenizer, request, self.end_id) for request in requests]
        futures = [
            self._batcher.submit(self._checked_prompt(request), sampling, allowed)
            for request, allowed in zip(requests, choices, strict=True)
        ]
        try:
            replies = await asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
        except asyncio.CancelledError:  # the caller gave up (a client hung up): stop generating
            for future in futures:
                self._batcher.abandon(future)
            raise
        for reply, allowed in zip(replies, choices, strict=True):
            reply.choices = allowed
        return list(replies)

    def _checked_prompt(self, request: GenerationRequest) -> list[int]:
        ids = request.prompt_ids if request.prompt_ids is not None else self.prompt_ids(request.messages)
        vocab = self.model.get_input_embeddings().num_embeddings
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"prompt_ids hold token ids outside the vocabulary [0, {vocab})")
        return ids

    def logprobs_of(
        self, prompt_ids: list[int], completion_ids: list[int], temperature: float = 1.0
    ) -> list[float]:
        """Log-probs of ``completion_ids`` following ``prompt_ids`` under the current weights,
        ``log_softmax(logits / T)`` as in sampling (``T == 0`` counts as 1). No gradient."""
        if not prompt_ids or not completion_ids:
            raise ValueError("prompt_ids and completion_ids must both be non-empty")
        ids = torch.tensor([list(prompt_ids) + list(completion_ids)], device=self.device)
        with self.weights_lock, torch.inference_mode():
            # The last len(completion)+1 positions predict the completion (the very last predicts nothing).
            logits = self.model(input_ids=ids, logits_to_keep=len(completion_ids) + 1).logits[0, :-1]
            targets = torch.tensor(completion_ids, device=self.device)
            return token_logprobs(logits, targets, temperature).tolist()

    def update_weights(
        self, state_dict: Mapping[str, torch.Tensor], strict: bool = True, version: int | None = None
    ) -> None:
        """Load new weights (e.g. from the trainer) between two decode steps and set
        :attr:`weights_version` to ``version`` (default: one more). Rows already generating
        continue under the new weights; their recorded log-probs and versions stay exact
        for the weights that sampled each token."""
        with self.weights_lock, torch.no_grad():
            self.model.load_state_dict(state_dict, strict=strict)
            self._batcher.version = self._batcher.version + 1 if version is None else version

    async def close(self) -> None:
        """Stop the batching thread; unanswered requests fail. The model stays loaded."""
        await asyncio.to_thread(self._batcher.close)
