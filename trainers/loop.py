"""The trainer: collect groups of rollouts from env servers, turn rewards into advantages,
update the policy, repeat. Read it top to bottom: ``Trainer.run`` is the whole algorithm.

Steps are numbered globally and checkpointed: steps ``1..bc_steps`` clone the expert
(behaviour cloning, AgentEvol's first stage and the RL warm start), the rest are RL steps
(or AgentEvol iterations). ``resume`` restarts after the last checkpoint, with the same
weights, optimizer, RNG, schedule position and metrics, so a killed run continues exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentgym.client import EnvClient
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.chat import END_OF_TURN_TOKENS
from agentgym.policies.hf import HFPolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.trainers.algorithms import (
    LossStats,
    agentevol_weights,
    aggregate,
    bapo_bounds,
    clipped_surrogate,
    dynamic_sampling_keep,
    kl_k3,
    weighted_nll,
)
from agentgym.trainers.batch import TokenBatch, collate, token_logprobs
from agentgym.trainers.checkpoint import MetricsLog, RunDir
from agentgym.trainers.config import ALGORITHMS, TrainConfig
from agentgym.trainers.schedules import FixedHorizon, ScalingInterHorizon
from agentgym.trajectory import Trajectory, TrajectoryWriter, read_trajectories

log = logging.getLogger(__name__)


class TokenizedExpert:
    """The environment's expert as a token-level policy: its reply is the expert action in
    the agent format, tokenized as a model reply (ending with the end-of-turn token), so
    behaviour cloning trains on exactly the tokens the model should emit."""

    name = "expert"

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        ends = [t for t in END_OF_TURN_TOKENS if t in tokenizer.get_vocab()]
        self.end_id = tokenizer.convert_tokens_to_ids(ends[0]) if ends else tokenizer.eos_token_id

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        replies = []
        for request in requests:
            text = request.info["expert_action"]
            ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.end_id]
            replies.append(Generation(text, ids, [0.0] * len(ids), "stop"))
        return replies

    async def close(self) -> None:
        return None


class Trainer:
    def __init__(self, config: TrainConfig, run_dir: str | Path, *, resume: bool = False) -> None:
        self.config = config
        self.run_dir = RunDir(run_dir)
        self.resume = resume
        self.schedule = (
            ScalingInterHorizon(config.rounds, config.interval)
            if config.schedule == "scaling-inter"
            else FixedHorizon(config.max_turns)
        )
        self.rl_steps = config.evol_iterations if config.algo == "agentevol" else config.steps
        self.total_steps = config.bc_steps + self.rl_steps

    # ----- the whole algorithm -------------------------------------------------------

    def run(self) -> Path:
        torch.manual_seed(self.config.seed)
        random.seed(self.config.seed)
        with self._env_server() as url:
            self.url = url
            self._load_model()
            start = self._restore()
            self.metrics = MetricsLog(
                self.run_dir.metrics_path,
                resume_step=start - 1 if self.resume else None,
                tensorboard_dir=self.run_dir.path / "tensorboard",
            )
            with _progress() as progress:
                bar = progress.add_task("training", total=self.total_steps, completed=start - 1)
                for step in range(start, self.total_steps + 1):
                    record = self._bc_step(step) if step <= self.config.bc_steps else self._rl_step(step)
                    if self._eval_due(step):
                        record["eval_success_rate"] = self._evaluate()
                    self.metrics.log(record)
                    if step % self.config.checkpoint_every == 0 or step == self.total_steps:
                        self.run_dir.save_checkpoint(
                            step, self.model, self.optimizer, {"phase": record["phase"]}
                        )
                    progress.update(bar, advance=1, description=_describe(record))
        return self.run_dir.path

    def _bc_step(self, step: int) -> dict[str, Any]:
        """One optimizer step of behaviour cloning on a minibatch of expert episodes."""
        expert = self._expert_dataset()
        rng = random.Random(self.config.seed * 7919 + step)
        chosen = rng.sample(expert, min(self.config.bc_batch_size, len(expert)))
        start = time.perf_counter()
        loss = self._optimizer_step(self._batch(chosen, [1.0] * len(chosen)), self._nll_loss)
        return {
            "step": step,
            "phase": "bc",
            "loss": loss,
            "episodes": len(chosen),
            "update_s": round(time.perf_counter() - start, 2),
        }

    def _rl_step(self, step: int) -> dict[str, Any]:
        t = step - self.config.bc_steps
        horizon = self.schedule.horizon_at(t) if self.config.algo != "agentevol" else self.config.max_turns
        start = time.perf_counter()
        trajectories = self._collect(step, horizon)
        rollout_s = time.perf_counter() - start
        usable = [traj for traj in trajectories if not traj.errored and traj.token_ids]
        record = {
            "step": step,
            "phase": "rl",
            "max_turns": horizon,
            **_rollout_stats(trajectories),
            "rollout_s": round(rollout_s, 2),
        }
        start = time.perf_counter()
        if self.config.algo == "agentevol":
            record.update(self._agentevol_learn(usable))
        elif usable:
            record.update(self._policy_update(usable))
        record["update_s"] = round(time.perf_counter() - start, 2)
        return record

    def _policy_update(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        rewards = torch.tensor([traj.score for traj in trajectories])
        group_of = {task: i for i, task in enumerate(dict.fromkeys(traj.task_id for traj in trajectories))}
        groups = torch.tensor([group_of[traj.task_id] for traj in trajectories])
        advantages = ALGORITHMS[self.config.algo].advantages(rewards, groups)
        if self.config.dynamic_sampling:
            keep = dynamic_sampling_keep(rewards, groups)
            trajectories = [traj for traj, kept in zip(trajectories, keep.tolist(), strict=True) if kept]
            advantages = advantages[keep]
            if not trajectories:
                return {"updates": [], "skipped": "every group had equal rewards"}
        batch = self._batch(trajectories, advantages.tolist())
        updates = []
        for _ in range(self.config.ppo_epochs):
            for index in torch.randperm(len(batch)).split(self.config.minibatch_size):
                updates.append(self._rl_update(batch.select(index)))
        summary = {key: _mean(u[key] for u in updates) for key in updates[0]}
        tokens = int(batch.attention_mask.sum()) * self.config.ppo_epochs
        return {**summary, "update_tokens": tokens, "updates": updates}

    def _rl_update(self, minibatch: TokenBatch) -> dict[str, float]:
        """One optimizer step: BAPO searches its bounds on the whole minibatch first."""
        algorithm = ALGORITHMS[self.config.algo]
        if algorithm.loss == "bapo":
            with torch.no_grad():
                logp, _ = self._logprobs(minibatch)
            c_low, c_high, _ = bapo_bounds(
                logp, minibatch.old_logp, minibatch.weights, minibatch.loss_mask, self.config.bapo
            )
        else:
            c_low, c_high = 1 - self.config.clip.eps_low, 1 + self.config.clip.eps_high
        stats: list[LossStats] = []
        entropies: list[float] = []

        def loss_fn(micro: TokenBatch) -> torch.Tensor:
            logp, entropy = self._logprobs(micro, with_entropy=True)
            loss, micro_stats = clipped_surrogate(
                logp,
                micro.old_logp,
                micro.weights,
                micro.loss_mask,
                clip_low=c_low,
                clip_high=c_high,
                aggregation=self.config.loss_aggregation,
            )
            mean_entropy = aggregate(entropy, micro.loss_mask, self.config.loss_aggregation)
            stats.append(micro_stats)
            entropies.append(mean_entropy.detach().item())
            loss = loss - self.config.entropy_coef * mean_entropy
            if self.config.kl_coef:
                loss = loss + self.config.kl_coef * aggregate(
                    kl_k3(logp, self._reference_logp(micro)), micro.loss_mask, self.config.loss_aggregation
                )
            return loss

        loss = self._optimizer_step(minibatch, loss_fn)
        merged = {key: _mean(getattr(s, key) for s in stats) for key in asdict(stats[0])}
        return {**merged, "clip_low": c_low, "clip_high": c_high, "entropy": _mean(entropies), "loss": loss}

    def _agentevol_learn(self, explored: list[Trajectory]) -> dict[str, Any]:
        """Learn from the base model again, on expert ∪ explored, weighted by reward."""
        self._reset_trainable()
        expert = self._expert_dataset()
        rewards = torch.tensor([traj.score for traj in explored])
        weights = [1.0] * len(expert) + agentevol_weights(rewards, self.config.evol_reward_threshold).tolist()
        data = list(zip([*expert, *explored], weights, strict=True))
        rng = random.Random(self.config.seed * 104729 + len(explored))
        losses = []
        for _ in range(max(1, self.config.bc_steps)):
            chosen = rng.sample(data, min(self.config.minibatch_size, len(data)))
            batch = self._batch([c[0] for c in chosen], [c[1] for c in chosen])
            losses.append(self._optimizer_step(batch, self._nll_loss))
        return {"loss": _mean(losses), "learn_episodes": len(data)}

    # ----- the pieces ------------------------------------------------------------------

    def _nll_loss(self, micro: TokenBatch) -> torch.Tensor:
        logp, _ = self._logprobs(micro, temperature=1.0)  # likelihood of the demonstrations
        return weighted_nll(logp, micro.loss_mask, micro.weights, self.config.loss_aggregation)

    def _optimizer_step(self, minibatch: TokenBatch, loss_fn: Any) -> float:
        """Accumulate gradients over micro-batches (each weighted by its share of episodes),
        clip, step. Returns the minibatch loss."""
        with self.policy.weights_lock:  # the policy's batcher never samples from half-updated weights
            return self._accumulate_and_step(minibatch, loss_fn)

    def _accumulate_and_step(self, minibatch: TokenBatch, loss_fn: Any) -> float:
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for index in minibatch.by_length().split(self.config.micro_batch_size):
            share = len(index) / len(minibatch)
            loss = loss_fn(minibatch.select(index).trimmed().to(self.device)) * share
            loss.backward()
            total += loss.detach().item()
        torch.nn.utils.clip_grad_norm_(self._trainable, self.config.max_grad_norm)
        self.optimizer.step()
        self.model.eval()
        return total

    def _reference_logp(self, micro: TokenBatch) -> torch.Tensor:
        """Log-probs under the initial policy: the base model with the adapters switched off."""
        if not self.config.lora:
            raise ValueError("kl_coef needs lora: true (the reference is the base model without adapters)")
        with torch.no_grad(), self.model.disable_adapter():
            return self._logprobs(micro)[0]

    def _logprobs(
        self, batch: TokenBatch, *, temperature: float | None = None, with_entropy: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (and entropies) of the batch's agent tokens under the current weights, at
        the sampling temperature unless told otherwise."""
        return token_logprobs(
            self.model,
            batch.input_ids,
            batch.attention_mask,
            positions=batch.loss_mask,
            temperature=self.config.temperature if temperature is None else temperature,
            with_entropy=with_entropy,
        )

    def _batch(self, trajectories: list[Trajectory], weights: list[float]) -> TokenBatch:
        records = [
            {"token_ids": t.token_ids, "loss_mask": t.loss_mask, "logprobs": t.logprobs} for t in trajectories
        ]
        return collate(records, weights, self.pad_id)

    def _collect(self, step: int, horizon: int) -> list[Trajectory]:
        rng = random.Random(self.config.seed * 1_000_003 + step)  # same tasks after a resume
        tasks = rng.sample(self.train_tasks, min(self.config.tasks_per_step, len(self.train_tasks)))
        specs = [
            EpisodeSpec(task, sample=k, split="train")
            for task in tasks
            for k in range(self.config.group_size)
        ]
        # No per-request seed: the samples of a group must differ (one shared seed makes them identical).
        sampling = SamplingParams(
            temperature=self.config.temperature, max_new_tokens=self.config.max_new_tokens
        )
        rollout = RolloutConfig(
            max_turns=horizon,
            sampling=sampling,
            concurrency=self.config.concurrency,
            format=self.config.agent_format,
        )
        trajectories = self._play(self.policy, specs, rollout)
        folder = self.run_dir.path / "rollouts"
        folder.mkdir(exist_ok=True)
        with TrajectoryWriter(folder / f"step-{step:06d}.jsonl", fsync=False) as writer:
            for trajectory in trajectories:
                writer.write(trajectory)
        return trajectories

    def _evaluate(self) -> float:
        """Greedy success rate on the first ``eval_tasks`` test tasks at the final horizon."""
        tasks = self.test_tasks[: self.config.eval_tasks]
        horizon = (
            self.schedule.horizon_at(max(1, self.rl_steps))
            if self.config.algo != "agentevol"
            else self.config.max_turns
        )
        sampling = SamplingParams(temperature=0.0, max_new_tokens=self.config.max_new_tokens)
        trajectories = self._play(
            self.policy,
            [EpisodeSpec(t, split="test") for t in tasks],
            RolloutConfig(
                max_turns=horizon,
                sampling=sampling,
                concurrency=self.config.concurrency,
                format=self.config.agent_format,
            ),
        )
        return _mean(float(t.success) for t in trajectories)

    def _expert_dataset(self) -> list[Trajectory]:
        """Expert episodes on train tasks, collected once per run and kept in the run folder."""
        if getattr(self, "_expert", None) is not None:
            return self._expert
        path = self.run_dir.path / "expert.jsonl"
        if not path.exists() or not read_trajectories(path):
            specs = [EpisodeSpec(t, split="train") for t in self.train_tasks[: self.config.bc_episodes]]
            episodes = self._play(
                TokenizedExpert(self.tokenizer),
                specs,
                RolloutConfig(concurrency=self.config.concurrency, format=self.config.agent_format),
            )
            with TrajectoryWriter(path) as writer:
                for episode in episodes:
                    if (
                        episode.success
                        and episode.token_ids
                        and len(episode.token_ids) <= self.config.bc_max_tokens
                    ):
                        writer.write(episode)
        self._expert = read_trajectories(path)
        if not self._expert:
            raise RuntimeError("the expert solved no train task: nothing to clone")
        return self._expert

    def _play(self, policy: Any, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        return asyncio.run(run_episodes(self.url, policy, specs, rollout))

    def _eval_due(self, step: int) -> bool:
        every, t = self.config.eval_every, step - self.config.bc_steps
        return step == self.total_steps or (every > 0 and t > 0 and t % every == 0)

    # ----- set-up and resume -----------------------------------------------------------

    @contextlib.contextmanager
    def _env_server(self) -> Iterator[str]:
        if self.config.env_url:
            yield self.config.env_url
            return
        from agentgym.servers.launcher import start_server_process, wait_healthy

        args = ["--log-level", "warning", "--max-sessions", str(max(64, 2 * self.config.concurrency))]
        for key, value in self.config.env_settings.items():
            args += ["--set", f"{key}={value}"]
        server = start_server_process(
            self.config.env, extra_args=args, log_path=str(self.run_dir.path / "env.log")
        )
        try:
            wait_healthy(server.url, 300, server.process)
            yield server.url
        finally:
            server.stop()

    def _load_model(self) -> None:
        self.policy = HFPolicy(self.config.model, dtype=self._dtype())
        self.tokenizer = self.policy.tokenizer
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.device = self.policy.device
        model = self.policy.model
        if self.config.lora:
            from peft import LoraConfig, get_peft_model

            # Adapters are injected into the policy's own modules, so generation samples
            # from the weights being trained: no copy, no transfer on one device.
            model = get_peft_model(
                model,
                LoraConfig(
                    r=self.config.lora_rank,
                    lora_alpha=self.config.lora_alpha,
                    lora_dropout=0.0,
                    target_modules=self.config.lora_targets,
                    layers_to_transform=self._top_layers(model),
                    task_type="CAUSAL_LM",
                ),
            )
        else:
            model.requires_grad_(True)
        self.model = model
        self._trainable = [p for p in model.parameters() if p.requires_grad]
        self._initial = {k: v.detach().clone() for k, v in model.named_parameters() if v.requires_grad}
        self.optimizer = torch.optim.AdamW(
            self._trainable, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        with EnvClient(self.url) as client:
            self.train_tasks = [t.task_id for t in client.tasks(split="train", limit=10_000).tasks]
            self.test_tasks = [t.task_id for t in client.tasks(split="test", limit=10_000).tasks]

    def _top_layers(self, model: torch.nn.Module) -> list[int] | None:
        if self.config.lora_layers is None:
            return None
        total = model.config.num_hidden_layers
        return list(range(max(0, total - self.config.lora_layers), total))

    def _reset_trainable(self) -> None:
        """Back to the base model (AgentEvol learns from it every iteration)."""
        self.model.load_state_dict(self._initial, strict=False)
        self.optimizer.state.clear()

    def _restore(self) -> int:
        """First step to run: 1, or the step after the latest checkpoint when resuming."""
        config_path = self.run_dir.path / "config.yaml"
        if not self.resume:
            self.config.save(config_path)
            return 1
        checkpoint = self.run_dir.latest_checkpoint()
        if checkpoint is None:
            self.config.save(config_path)
            return 1
        state = RunDir.load_checkpoint(checkpoint, self.model, self.optimizer)
        log.info("resumed from %s (step %d)", checkpoint, state["step"])
        return state["step"] + 1

    def _dtype(self) -> torch.dtype | None:
        if self.config.bf16 and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return None


def _rollout_stats(trajectories: list[Trajectory]) -> dict[str, Any]:
    finished = [t for t in trajectories if not t.errored]
    return {
        "episodes": len(trajectories),
        "errored": len(trajectories) - len(finished),
        "success_rate": _mean(float(t.success) for t in finished),
        "reward_mean": _mean(t.score for t in finished),
        "turns_mean": _mean(t.turns for t in finished),
        "generated_tokens": sum(t.generated_tokens or 0 for t in finished),
        # Summed over concurrent episodes: their ratio splits the rollout's wall time.
        "generation_s_sum": round(sum(t.timings.get("generation", 0.0) for t in finished), 2),
        "env_s_sum": round(sum(t.timings.get("env", 0.0) for t in finished), 2),
    }


def _mean(values: Any) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


def _describe(record: dict[str, Any]) -> str:
    if record["phase"] == "bc":
        return f"bc  loss {record['loss']:.3f}"
    return f"rl  success {record['success_rate']:.2f} turns≤{record['max_turns']}"


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
    )
