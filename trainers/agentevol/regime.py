"""AgentEvol as a training regime: explore, then learn again from the base model on the
expert and explored episodes, each weighted by its reward."""

from __future__ import annotations

import random
import time
from typing import Any

import torch

from agentgym.trainers.algorithms import agentevol_weights
from agentgym.trainers.batch import collate, token_record
from agentgym.trainers.figures import average, rollout_stats, seconds_since
from agentgym.trainers.regimes import ClippedRL, nll


class AgentEvol(ClippedRL):
    """AgentEvol: explore (sample episodes), then learn from the base model again on
    expert ∪ explored, each episode weighted by its reward (filtered BC with a threshold)."""

    @staticmethod
    def rl_steps(config: Any) -> int:
        return config.agentevol.iterations

    def step(self, step: int) -> dict[str, Any]:
        run, config = self.run, self.run.config
        start = time.perf_counter()
        explored, _, _ = run.collector.collect(step, run.version, config.max_turns)
        explored = [e for e in explored if not e.errored and e.token_ids]
        record = {"step": step, "phase": "rl", "max_turns": config.max_turns, **rollout_stats(explored)}
        record["rollout_s"] = seconds_since(start)
        run.learner.reset_to_initial()
        rewards = torch.tensor([e.score for e in explored])
        expert = run.demos.cloneable()
        weights = [1.0] * len(expert) + agentevol_weights(rewards, config.agentevol.reward_threshold).tolist()
        # Zero-weight episodes teach nothing and would only dilute the token mean.
        data = [(e, w) for e, w in zip([*expert, *explored], weights, strict=True) if w > 0]
        rng = random.Random(config.seed * 104729 + len(explored))
        losses = []
        for _ in range(max(1, config.bc_steps)):
            chosen = rng.sample(data, min(config.minibatch_size, len(data)))
            batch = collate([token_record(e) for e, _ in chosen], [w for _, w in chosen], run.pad_id)
            losses.append(run.learner.optimize(run.minibatch(batch), nll(run.learner)))
        return record | {
            "loss": average(losses),
            "learn_episodes": len(data),
            "update_s": seconds_since(start),
        }
