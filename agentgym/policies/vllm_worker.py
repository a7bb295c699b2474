"""Runs inside vLLM's worker processes: loading new weights in place.

``VLLMPolicy`` starts its engine with ``worker_extension_cls`` naming :class:`WeightSync`,
so ``engine.collective_rpc("load_hf_weights", ...)`` calls it on every worker. The weights
travel as one ``safetensors`` blob (bytes pickle safely; tensors in a pickled call do not
survive vLLM's message encoding). Imported by vLLM only, never by the project itself.
"""

from __future__ import annotations

from typing import Any

import safetensors.torch


class WeightSync:
    """Mixed into vLLM's worker: ``self.model_runner`` and ``self.device`` are the worker's."""

    model_runner: Any
    device: Any

    def load_hf_weights(self, blob: bytes) -> int:
        """Load Hugging Face-named tensors (``safetensors.torch.save`` bytes); returns how many.

        ``reload_weights`` re-runs every layer's post-load processing (fused projections,
        the CPU kernels' repacked layouts); a plain ``load_weights`` would write into
        layers already repacked. On CPU a tied ``lm_head`` keeps its own packed copy of the
        embedding, so it is repacked here too, or the logits would stay the old weights'."""
        weights = safetensors.torch.load(blob)
        self.model_runner.reload_weights(weights_iterator=list(weights.items()))
        model = self.model_runner.model
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        tied = lm_head is not None and embed is not None and lm_head.weight is embed.weight
        if tied and self.device.type == "cpu":
            lm_head.quant_method.process_weights_after_loading(lm_head)
        return len(weights)
