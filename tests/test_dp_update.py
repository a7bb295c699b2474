"""One RL update on two data-parallel ranks equals the update of one process.

The same gathered batch (eight episodes, two minibatches, stale behaviour log-probs so
BAPO's bounds act) goes through ``update_policy`` once in one process and once in two
processes over gloo. The ranks' global torch RNGs are first moved apart, as they are in a
real run (rank 0 alone evaluates; each rank samples its own episodes): minibatches must
not depend on them. Gloo meets through a file, so no port is bound.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from agentgym.policies.hf import HFPolicy
from agentgym.trainers.batch import collate
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from agentgym.trainers.update import update_policy


def episodes() -> tuple[list[dict], list[float]]:
    """Eight episodes of uneven length, advantages of both signs."""
    records = []
    for index, agent in enumerate((2, 5, 3, 7, 4, 6, 2, 8)):
        ids = [5 + (index * 7 + t) % 90 for t in range(3 + agent)]
        records.append({"token_ids": ids, "loss_mask": [0] * 3 + [1] * agent, "logprobs": []})
    return records, [1.0, -1.0, 0.5, -0.5, 1.0, -1.0, 0.25, -0.25]


def one_update(rank: int, world: int, model_dir: str, store: str, out: str) -> None:
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    config = TrainConfig(
        algo="bapo", model=model_dir, micro_batch_size=1, minibatch_size=4, learning_rate=1e-3, seed=3
    )
    torch.manual_seed(0)  # identical initial weights on every rank
    learner = Learner(config, HFPolicy(model_dir), DataParallel(rank, world))
    records, advantages = episodes()
    batch = collate(records, advantages, pad_id=0)
    with torch.no_grad():  # behaviour log-probs off the current ones: every ratio moves
        drift = torch.linspace(-0.4, 0.4, batch.old_logp.numel()).view_as(batch.old_logp)
        batch.old_logp = (learner.logprobs(batch)[0] + drift) * batch.loss_mask
    torch.rand(17 + 5 * rank)  # the ranks' global RNGs part ways, as in a real run
    trainer = SimpleNamespace(
        config=config,
        learner=learner,
        dp=DataParallel(rank, world),
        version=4,
        minibatch=lambda b: b.weighted("token-mean"),
    )
    record = update_policy(trainer, batch, kl_coef=0.0)
    if rank == 0:
        weights = torch.cat([p.detach().flatten() for p in learner.trainable])
        figures = [
            {k: u[k] for k in ("loss", "clip_low", "clip_high", "positive_share", "bapo_search")}
            for u in record["updates"]
        ]
        Path(out).write_text(json.dumps({"updates": figures, "weights": weights.tolist()}))
    if world > 1:
        dist.destroy_process_group()


def run(world: int, model_dir: Path, folder: Path) -> dict:
    out = folder / f"world{world}.json"
    args = (world, str(model_dir), str(folder / f"store{world}"), str(out))
    mp.spawn(one_update, args=args, nprocs=world, join=True)
    return json.loads(out.read_text())


def test_two_ranks_make_the_bapo_update_of_one_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    single, double = run(1, tiny_model_dir, tmp_path), run(2, tiny_model_dir, tmp_path)
    assert len(single["updates"]) == len(double["updates"]) == 2
    assert all(u["bapo_search"] in ("reached", "saturated") for u in single["updates"])  # BAPO acted
    for one, two in zip(single["updates"], double["updates"], strict=True):
        assert two["bapo_search"] == one["bapo_search"]
        assert (two["clip_low"], two["clip_high"]) == (one["clip_low"], one["clip_high"])
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-4, abs=1e-6)
        assert two["positive_share"] == pytest.approx(one["positive_share"], rel=1e-4)
    moved = torch.tensor(double["weights"])
    assert torch.allclose(moved, torch.tensor(single["weights"]), atol=1e-6)
