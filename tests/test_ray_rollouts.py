"""Ray rollout workers (`generator: ray`): real Ray actors on a local Ray, each with its own
model copy, playing on a real env server; weights pushed from the trainer reach them."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from transformers import LlamaForCausalLM

from agentgym.agents.tokens import sampled_versions
from agentgym.play.rollout import EpisodeSpec, RolloutConfig
from agentgym.policies.base import SamplingParams
from agentgym.records.trajectory import read_trajectories
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.loop import Trainer
from conftest import run_metrics

ray = pytest.importorskip("ray", reason="the ray extra is installed by `make test`")


@pytest.fixture(scope="module")
def local_ray() -> object:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_workers_share_the_episodes_and_take_new_weights(
    local_ray: object, tiny_model_dir: Path, choice_url: str
) -> None:
    from agentgym.trainers.ray_rollouts import RayRollouts

    pool = RayRollouts(str(tiny_model_dir), choice_url, workers=2)
    assert len({ray.get(w.pid.remote()) for w in pool.workers}) == 2  # two processes
    rollout = RolloutConfig(max_turns=1, format="plain", sampling=SamplingParams(max_new_tokens=4))
    specs = [EpisodeSpec(f"choice/train/{t}", sample=k, split="train") for t in range(3) for k in range(2)]
    trajectories = asyncio.run(pool.play(choice_url, specs, rollout))
    assert Counter(t.task_id for t in trajectories) == {f"choice/train/{t}": 2 for t in range(3)}
    assert all(not t.errored and t.token_ids for t in trajectories)

    model = LlamaForCausalLM.from_pretrained(tiny_model_dir)
    weights = [(name, value + 0.01) for name, value in model.state_dict().items()]
    assert asyncio.run(pool.update_weights(weights)) == [1, 1]  # every worker loaded them
    asyncio.run(pool.close())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_trainer_collects_with_ray_workers(
    mode: str, local_ray: object, tiny_model_dir: Path, tmp_path: Path
) -> None:
    config = TrainConfig(
        algo="grpo",
        mode=mode,
        env="choice",
        model=str(tiny_model_dir),
        generator="ray",
        ray_workers=2,
        schedule="fixed",
        max_turns=1,
        bc_steps=1,
        bc_batch_size=2,
        bc_episodes=4,
        steps=2,
        tasks_per_step=2,
        group_size=2,
        minibatch_size=4,
        micro_batch_size=2,
        max_new_tokens=4,
        agent_format="plain",
        eval_every=0,
        eval_tasks=2,
    )
    run = Trainer(config, tmp_path / "run").run()
    records = run_metrics(run)
    rl = [r for r in records if r["phase"] == "rl"]
    assert [r["episodes"] for r in rl] == [4, 4] and all(r["errored"] == 0 for r in rl)
    assert "eval_success_rate" in records[-1]
    # The workers record the version they were sent: async plays step 3 during step 2's update.
    behaviour = {2: 1, 3: 2 if mode == "sync" else 1}
    for step, version in behaviour.items():
        played = read_trajectories(run / "rollouts" / f"step-{step:06d}.jsonl")
        assert {v for t in played for v in sampled_versions(t.versions, t.loss_mask)} == {version}
