"""Data-parallel training over ``torch.distributed`` (gloo on CPU, nccl on GPU).

``agentgym train --nproc N`` starts N copies of the trainer with ``torch.distributed.run``
(torchrun), which sets ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``; :meth:`DataParallel.from_env`
joins that group. One process (``WORLD_SIZE`` unset) is the same code with ``world = 1``,
where every operation here is the identity.

How the work is split, so that N processes compute what one would:

* rollouts: each rank plays the groups of every N-th task of the step, then all ranks
  gather the whole batch (REINFORCE++ and the logged rates need all of it);
* updates: every rank holds the same minibatch and forms the same micro-batches; rank r
  runs micro-batches r, r+N, ... and the gradients are summed over ranks once per
  optimizer step. Each micro-batch's loss is weighted by its share of the whole minibatch,
  so the summed gradient is the single-process gradient (up to float summation order).

Gradients are all-reduced by hand rather than by ``DistributedDataParallel``: DDP expects
the same number of backward passes on every rank, and ranks here may run different
numbers of micro-batches (episodes that error out, a last minibatch smaller than N).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

T = TypeVar("T")


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> DataParallel:
        """Join the process group torchrun describes in the environment, if any."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world == 1:
            return cls()
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        return cls(dist.get_rank(), dist.get_world_size())

    @property
    def main(self) -> bool:
        """Rank 0 writes metrics, checkpoints and rollouts and runs evaluations."""
        return self.rank == 0

    def device(self) -> str | None:
        """This rank's GPU (``LOCAL_RANK``) on CUDA machines; ``None`` leaves the default."""
        if self.world > 1 and torch.cuda.is_available():
            return f"cuda:{os.environ.get('LOCAL_RANK', self.rank)}"
        return None

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's items: every ``world``-th, starting at ``rank``."""
        return list(items[self.rank :: self.world])

    def gather(self, shard: list[T]) -> list[T]:
        """Every rank's list, concatenated in rank order (the same on every rank)."""
        if self.world == 1:
            return list(shard)
        import torch.distributed as dist

        shards: list[list[T]] = [[] for _ in range(self.world)]
        dist.all_gather_object(shards, shard)
        return [item for part in shards for item in part]

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """``value`` summed over ranks (in place)."""
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(value)
        return value

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks, in one flat all-reduce."""
        if self.world == 1:
            return
        params = list(parameters)
        for p in params:
            if p.grad is None:  # a rank that ran no micro-batch still takes part
                p.grad = torch.zeros_like(p)
        flat = self.sum(torch.cat([p.grad.reshape(-1) for p in params]))
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
            offset += p.numel()

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command that runs ``agentgym <argv>`` in ``nproc`` local processes."""
    import sys

    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "agentgym.cli",
        *argv,
    ]


def sharded_index(parts: Sequence[torch.Tensor], data_parallel: DataParallel) -> torch.Tensor:
    """The rows of this rank's ``parts`` (micro-batch index tensors) as one index."""
    mine = data_parallel.shard(parts)
    return torch.cat(mine) if mine else torch.zeros(0, dtype=torch.long)
