"""Rollout workers as Ray actors, on this machine or on other nodes of a Ray cluster.

With ``generator: ray`` the trainer keeps the model it updates, and ``ray_workers`` actors
each hold their own copy of the policy (an ``HFPolicy``) and play a share of every step's
episodes against the env server. Before the workers next sample after an update, the
trainer sends them the new weights (LoRA merged in) through Ray's object store, once per
step, not once per worker.

Ray is an optional extra (``pip install 'agentgym-platform[ray]'``). ``ray_address``
joins an existing cluster (``ray start --head`` on one node, ``ray start --address ...``
on the others); without it Ray starts a local instance. Workers on other nodes must reach
the env server: give the trainer ``env_url`` of a server or gateway bound to an address
they can reach.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from types import ModuleType
from typing import Any

from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.records.trajectory import Trajectory


class RolloutWorker:
    """One Ray actor: a policy of its own and an event loop that plays episodes with it."""

    def __init__(self, model: str, url: str, dtype: str | None = None) -> None:
        from agentgym.policies.hf import HFPolicy

        self.policy = HFPolicy(model, dtype=dtype)
        self.url = url
        self.loop = asyncio.new_event_loop()

    def update_weights(self, weights: dict[str, Any], version: int | None = None) -> int:
        self.policy.update_weights(weights, version=version)
        return self.policy.weights_version

    def play(self, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        return self.loop.run_until_complete(run_episodes(self.url, self.policy, specs, rollout))

    def pid(self) -> int:
        return os.getpid()


class RayRollouts:
    """A pool of :class:`RolloutWorker` actors with the trainer's generator interface:
    ``play(url, specs, rollout)``, ``update_weights(weights)`` and ``close()``, all awaitable.

    Args:
        model: what each worker loads (alias, Hugging Face id or folder it can read).
        url: the env server the workers play on.
        workers: number of actors, each reserving ``cpus_per_worker`` CPUs.
        dtype: each worker's model dtype (None: :mod:`agentgym.policies.dtypes`' rule
            on the worker's device).
        address: a running Ray cluster to join; ``None`` starts a local Ray.
    """

    def __init__(
        self,
        model: str,
        url: str,
        *,
        workers: int = 2,
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        dtype: str | None = None,
    ) -> None:
        self._ray = _import_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if not self._ray.is_initialized():
            self._ray.init(address=address, include_dashboard=False, log_to_driver=False)
        actor = self._ray.remote(num_cpus=cpus_per_worker)(RolloutWorker)
        self.workers = [actor.remote(model, url, dtype) for _ in range(workers)]

    async def play(self, url: str, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        """Play ``specs``: worker i takes the groups of every i-th task (a group stays on
        one worker, so its samples come from one set of weights)."""
        task_number = {task: i for i, task in enumerate(dict.fromkeys(s.task_id for s in specs))}
        shares: list[list[EpisodeSpec]] = [[] for _ in self.workers]
        for spec in specs:
            shares[task_number[spec.task_id] % len(self.workers)].append(spec)
        calls = [
            w.play.remote(share, rollout) for w, share in zip(self.workers, shares, strict=True) if share
        ]
        return [t for part in await asyncio.gather(*calls) for t in part]

    async def update_weights(self, weights: list[tuple[str, Any]], version: int | None = None) -> list[int]:
        """Send ``(name, tensor)`` weights to every worker (one copy in the object store),
        tagged ``version`` (default: each worker's next); returns each worker's version."""
        shared = self._ray.put(dict(weights))
        return list(await asyncio.gather(*(w.update_weights.remote(shared, version) for w in self.workers)))

    async def close(self) -> None:
        for worker in self.workers:
            self._ray.kill(worker)
        self.workers = []


def _import_ray() -> ModuleType:
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        raise ImportError("generator: ray needs Ray: pip install 'agentgym-platform[ray]'") from exc
