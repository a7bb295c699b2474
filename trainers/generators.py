"""What samples the rollouts: one :class:`Generator` protocol, four backends.

``hf`` in ``sync`` mode samples from the trained model itself (no weights to move); in
``async`` mode from an in-process copy sent the trainable tensors; ``vllm`` and ``ray`` are
sent the merged weights. Every backend takes the learner's weights through the same
``update_weights(learner, version)`` and plays through the same ``play``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import torch

from agentgym.play.rollout import EpisodeSpec, RolloutConfig, Rollouts, run_episodes
from agentgym.policies.base import Policy
from agentgym.policies.dtypes import dtype_name
from agentgym.policies.hf import HFPolicy
from agentgym.records.trajectory import Trajectory
from agentgym.trainers.learner import Learner, adapt


class Generator(Protocol):
    async def update_weights(self, learner: Learner, version: int) -> None:
        """Sample from the learner's current weights from now on, tagging tokens ``version``."""

    async def play(
        self, specs: list[EpisodeSpec], rollout: RolloutConfig, token_budget: int | None
    ) -> list[Trajectory]:
        """Resume paused episodes, then play ``specs``; episodes past ``token_budget`` pause."""

    async def evaluate(self, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        """Play ``specs`` to the end, apart from the paused training episodes."""

    @property
    def paused(self) -> list[Any]: ...

    async def drop(self, episodes: list[Any]) -> None: ...

    async def close(self) -> None: ...


WeightSender = Callable[[Learner, int], Awaitable[None]]


class PolicyGenerator:
    """A :class:`~agentgym.policies.base.Policy` playing through :class:`Rollouts`."""

    def __init__(self, policy: Policy, url: str, send: WeightSender) -> None:
        self.policy, self.url, self._send = policy, url, send
        self._rollouts = Rollouts(url, policy)

    async def start(self) -> PolicyGenerator:
        await self._rollouts.__aenter__()
        return self

    async def update_weights(self, learner: Learner, version: int) -> None:
        await self._send(learner, version)

    async def play(
        self, specs: list[EpisodeSpec], rollout: RolloutConfig, token_budget: int | None
    ) -> list[Trajectory]:
        return await self._rollouts.play(specs, config=rollout, token_budget=token_budget)

    async def evaluate(self, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        return await run_episodes(self.url, self.policy, specs, rollout)

    @property
    def paused(self) -> list[Any]:
        return self._rollouts.paused

    async def drop(self, episodes: list[Any]) -> None:
        await self._rollouts.drop(episodes)

    async def close(self) -> None:
        try:
            await self._rollouts.__aexit__(None, None, None)
        finally:
            await self.policy.close()


class RayGenerator:
    """Ray actors, each with its own model copy, sent merged weights (no partial rollouts)."""

    def __init__(self, config: Any, url: str) -> None:
        from agentgym.trainers.ray_rollouts import RayRollouts

        self.url = url
        self.pool = RayRollouts(
            config.model, url, workers=config.ray_workers, address=config.ray_address, dtype=config.dtype
        )

    async def update_weights(self, learner: Learner, version: int) -> None:
        await self.pool.update_weights(merged_weights(learner.model), version=version)

    async def play(
        self, specs: list[EpisodeSpec], rollout: RolloutConfig, token_budget: int | None
    ) -> list[Trajectory]:
        return await self.pool.play(self.url, specs, rollout)

    async def evaluate(self, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        return await self.pool.play(self.url, specs, rollout)

    @property
    def paused(self) -> list[Any]:
        return []

    async def drop(self, episodes: list[Any]) -> None:
        return None

    async def close(self) -> None:
        await self.pool.close()


async def start_generator(config: Any, learner: Learner, url: str) -> Generator:
    """The generator ``config`` asks for (``generator``, ``mode``), started."""
    if config.generator == "ray":
        return RayGenerator(config, url)
    if config.generator == "vllm":
        from agentgym.policies.vllm import VLLMPolicy

        engine = VLLMPolicy(
            config.model,
            # the learner's dtype, so behaviour log-probs are the learner's up to kernel noise
            dtype=dtype_name(learner.policy.model.dtype),
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        )
        return await PolicyGenerator(engine, url, _send_merged(engine)).start()
    if config.mode == "sync":
        return await PolicyGenerator(learner.policy, url, _set_version(learner.policy)).start()
    copy = HFPolicy(config.model, dtype=learner.policy.model.dtype, device=learner.device)
    adapt(copy.model, config)  # the same adapter structure, so the trainable tensors load by name
    return await PolicyGenerator(copy, url, _send_trainable(copy)).start()


def _set_version(policy: HFPolicy) -> WeightSender:
    """The trained model itself: its weights are already the learner's."""

    async def send(learner: Learner, version: int) -> None:
        policy.weights_version = version

    return send


def _send_trainable(copy: HFPolicy) -> WeightSender:
    async def send(learner: Learner, version: int) -> None:
        state = {
            name.removeprefix("base_model.model."): p.detach().clone()
            for name, p in learner.named_trainable()
        }
        copy.update_weights(state, strict=False, version=version)

    return send


def _send_merged(engine: Any) -> WeightSender:
    async def send(learner: Learner, version: int) -> None:
        await engine.update_weights(merged_weights(learner.model), version=version)

    return send


def merged_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's weights under their Hugging Face names, LoRA adapters merged in: what a
    separate generator (vLLM, Ray) loads. Copies, because the adapters are taken out again."""
    if not hasattr(model, "merge_adapter"):
        return [(name, t.detach().clone()) for name, t in model.state_dict().items()]
    model.merge_adapter()
    try:
        return [
            (name.removeprefix("base_model.model.").replace(".base_layer", ""), t.detach().clone())
            for name, t in model.state_dict().items()
            if "lora_" not in name
        ]
    finally:
        model.unmerge_adapter()
