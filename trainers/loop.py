"""The trainer: collect groups of rollouts from env servers, turn rewards into advantages,
update the policy, repeat. Read it top to bottom: ``Trainer.run`` is the whole algorithm.

Steps are numbered globally and checkpointed: steps ``1..bc_steps`` clone the expert
(behaviour cloning, AgentEvol's first stage and the RL warm start), the rest are RL steps
(or AgentEvol iterations). ``resume`` restarts after the last checkpoint, with the same
weights, optimizer, RNG, schedule position, replay buffer and metrics, so a killed run
continues exactly (an async run's in-flight rollouts and paused episodes are played anew).

Off-policy settings (docs/training.md): ``mode: async`` plays step t+1's episodes while
step t updates; ``replay_ratio`` mixes past episodes into each update; with
``partial_rollout_tokens`` episodes pause at a token budget and resume a step later. Every
token records the policy version that sampled it, and no update trains on a token more
than ``max_staleness`` versions old (:mod:`agentgym.trainers.offpolicy`).
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

import psutil
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agentgym import registry
from agentgym.client import EnvClient
from agentgym.critique import critique_metrics, critique_round
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.chat import END_OF_TURN_TOKENS
from agentgym.policies.hf import HFPolicy
from agentgym.rollout import EpisodeSpec, RolloutConfig, Rollouts, run_episodes
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
from agentgym.trainers.critique_rl import (
    BaseModelActor,
    demonstrations,
    rloo_groups,
    stage_of,
    stage_rewards,
    swapped_weights,
)
from agentgym.trainers.distributed import DataParallel, sharded_index
from agentgym.trainers.offpolicy import (
    PendingGroups,
    ReplayBuffer,
    Sample,
    staleness,
    token_staleness,
)
from agentgym.trainers.schedules import FixedHorizon, ScalingInterHorizon
from agentgym.trajectory import Trajectory, TrajectoryWriter, read_trajectories

log = logging.getLogger(__name__)

REPLAY_FILE = "replay.jsonl"
"""The replay buffer's samples, saved inside each checkpoint folder."""


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
        self.critique = config.algo == "critique-rl"
        self.rl_steps = {
            "agentevol": config.evol_iterations,
            "critique-rl": config.stage1_steps + config.stage2_steps,
        }.get(config.algo, config.steps)
        self._reference: list[torch.Tensor] | None = None
        """Critique-RL Stage II: the Stage-I critic's trainable weights, the KL reference."""
        self.total_steps = config.bc_steps + self.rl_steps

    # ----- the whole algorithm -------------------------------------------------------

    def run(self) -> Path:
        torch.manual_seed(self.config.seed)  # the same on every rank: identical initial adapters
        random.seed(self.config.seed)
        self.dp = DataParallel.from_env()
        try:
            # One event loop for the whole run: a vLLM engine stays bound to the loop it started on.
            with self._env_server() as url, asyncio.Runner() as self._loop:
                self.url = url
                self._load_model()
                self._cleanup = contextlib.AsyncExitStack()
                try:
                    self._train_from(self._restore())
                finally:
                    self._run(self._cleanup.aclose())
        finally:
            self.dp.close()
        return self.run_dir.path

    def _train_from(self, start: int) -> None:
        if self.dp.main:
            self.metrics = MetricsLog(
                self.run_dir.metrics_path,
                resume_step=start - 1 if self.resume else None,
                tensorboard_dir=self.run_dir.path / "tensorboard",
            )
        self._set_version(start - 1)
        self.generator = self._start_generator()
        with _progress(visible=self.dp.main) as progress:
            bar = progress.add_task("training", total=self.total_steps, completed=start - 1)
            for step in range(start, self.total_steps + 1):
                started, cpu = time.perf_counter(), psutil.cpu_times()
                if step <= self.config.bc_steps:
                    record = self._bc_step(step)
                else:
                    record = self._critique_step(step) if self.critique else self._rl_step(step)
                self._set_version(step)
                record.update(step_s=round(time.perf_counter() - started, 2), cpu_idle_share=_idle_share(cpu))
                if self.dp.main:  # the other ranks go on to the next step and wait for rank 0 there
                    self._finish_step(step, record)
                progress.update(bar, advance=1, description=_describe(record))

    def _set_version(self, version: int) -> None:
        """The policy version is the number of training steps done: tokens sampled from here
        on record it (the in-process policy; a separate generator gets it when published)."""
        self.version = version
        self.policy.weights_version = version

    def _finish_step(self, step: int, record: dict[str, Any]) -> None:
        """Rank 0: evaluate when due, log the step, checkpoint when due."""
        if self._eval_due(step):
            record.update(
                self._evaluate_critic() if self.critique else {"eval_success_rate": self._evaluate()}
            )
        self.metrics.log(record)
        if step % self.config.checkpoint_every == 0 or step == self.total_steps:
            files = {REPLAY_FILE: self.replay.dumps()} if self.config.replay_ratio > 0 else {}
            self.run_dir.save_checkpoint(step, self.model, self.optimizer, {"phase": record["phase"]}, files)

    def _bc_step(self, step: int) -> dict[str, Any]:
        """One optimizer step of behaviour cloning on a minibatch of expert episodes (for
        critique-rl: of synthetic critiques)."""
        demos = self._critique_demos() if self.critique else [_tokens(t) for t in self._expert_dataset()]
        rng = random.Random(self.config.seed * 7919 + step)
        chosen = rng.sample(demos, min(self.config.bc_batch_size, len(demos)))
        start = time.perf_counter()
        loss = self._optimizer_step(collate(chosen, [1.0] * len(chosen), self.pad_id), self._nll_loss)
        return {
            "step": step,
            "phase": "bc",
            "loss": loss,
            "episodes": len(chosen),
            "update_s": round(time.perf_counter() - start, 2),
        }

    def _rl_step(self, step: int) -> dict[str, Any]:
        """Take this step's episodes (sync: collect them now; async: those generated during
        the last update), start generating the next step's (async), then update on the
        groups that completed, fresh and replayed, within the staleness bound."""
        start = time.perf_counter()
        trajectories, rollout_s = self._rollouts_for(step)
        record = {
            "step": step,
            "phase": "rl",
            "mode": self.config.mode,
            "max_turns": self._horizon(step),
            **_rollout_stats(trajectories),
            "rollout_s": round(rollout_s, 2),
            "wait_s": round(time.perf_counter() - start, 2),
        }
        if self.config.mode == "async" and step < self.total_steps:
            self._launch_collection(step + 1)
        start = time.perf_counter()
        if self.config.algo == "agentevol":
            usable = [traj for traj in trajectories if not traj.errored and traj.token_ids]
            record.update(self._agentevol_learn(usable))
        else:
            self._groups.add(trajectories)
            batch, off_policy = self._off_policy_batch(step)
            record.update(off_policy)
            if batch is not None:
                # Async: the update runs in a thread while the event loop keeps playing the next step's episodes.
                record.update(self._in_background(self._update_on, batch))
        record["update_s"] = round(time.perf_counter() - start, 2)
        return record

    def _off_policy_batch(self, step: int) -> tuple[TokenBatch | None, dict[str, Any]]:
        """The update's batch: the groups that completed (advantages within each group),
        less episodes beyond ``max_staleness``, plus replayed samples; and its figures."""
        fresh = self._group_samples(self._groups.take_complete())
        current = [s for s in fresh if staleness(s.trajectory, self.version) <= self.config.max_staleness]
        rng = random.Random(self.config.seed * 7_368_787 + step)
        replayed = self.replay.draw(len(current), self.config.replay_ratio, self.version, rng)
        samples = current + replayed
        tokens_lag = token_staleness((s.trajectory for s in samples), self.version)
        if tokens_lag and max(tokens_lag) > self.config.max_staleness:  # an invariant, not a setting
            raise RuntimeError(f"a batch holds tokens {max(tokens_lag)} versions stale")
        if self.config.replay_ratio > 0:
            self.replay.add(current)
        figures = {
            "policy_version": self.version,
            "fresh_episodes": len(current),
            "replayed_episodes": len(replayed),
            "dropped_stale": len(fresh) - len(current),
            "waiting_episodes": self._groups.waiting,
            "paused_episodes": len(self.rollouts.paused) if self.rollouts else 0,
            "dropped_paused": self._dropped_paused,
            "staleness_mean": _mean(tokens_lag),
            "staleness_max": max(tokens_lag, default=0),
        }
        if not samples:
            return None, {**figures, "updates": [], "skipped": "no episode to train on this step"}
        batch = self._batch([s.trajectory for s in samples], [s.advantage for s in samples])
        return batch, figures

    def _group_samples(self, groups: list[list[Trajectory]]) -> list[Sample]:
        """Each complete group's usable episodes with their advantages (DAPO's dynamic
        sampling drops the groups whose rewards are all equal)."""
        groups = [[t for t in group if not t.errored and t.token_ids] for group in groups]
        members = [(traj, g) for g, group in enumerate(groups) for traj in group]
        if not members:
            return []
        rewards = torch.tensor([traj.score for traj, _ in members])
        group_ids = torch.tensor([g for _, g in members])
        advantages = ALGORITHMS[self.config.algo].advantages(rewards, group_ids)
        keep = dynamic_sampling_keep(rewards, group_ids) if self.config.dynamic_sampling else None
        return [
            Sample(traj, float(advantage))
            for i, ((traj, _), advantage) in enumerate(zip(members, advantages.tolist(), strict=True))
            if keep is None or keep[i]
        ]

    def _update_on(self, batch: TokenBatch) -> dict[str, Any]:
        """``ppo_epochs`` passes of clipped-surrogate updates over ``batch`` in minibatches."""
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
            local = minibatch.select(sharded_index(self._micro_batches(minibatch), self.dp))
            with torch.no_grad():
                logp = self._logprobs(local)[0] if len(local) else torch.zeros_like(local.old_logp)
            c_low, c_high, _ = bapo_bounds(
                logp, local.old_logp, local.weights, local.loss_mask, self.config.bapo, reduce=self.dp.sum
            )
        else:
            c_low, c_high = 1 - self.config.clip.eps_low, 1 + self.config.clip.eps_high
        stats: list[LossStats] = []
        entropies: list[float] = []
        ratios: list[torch.Tensor] = []
        kl_coef = self.config.stage2_kl_coef if self._reference is not None else self.config.kl_coef

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
            ratios.append(torch.exp(logp - micro.old_logp).detach()[micro.loss_mask.bool()].cpu())
            loss = loss - self.config.entropy_coef * mean_entropy
            if kl_coef:
                loss = loss + kl_coef * aggregate(
                    kl_k3(logp, self._reference_logp(micro)), micro.loss_mask, self.config.loss_aggregation
                )
            return loss

        loss = self._optimizer_step(minibatch, loss_fn)
        stats, entropies, ratios = self.dp.gather(stats), self.dp.gather(entropies), self.dp.gather(ratios)
        merged = {key: _mean(getattr(s, key) for s in stats) for key in asdict(stats[0])}
        return {
            **merged,
            **_ratio_figures(ratios),
            "clip_low": c_low,
            "clip_high": c_high,
            "entropy": _mean(entropies),
            "loss": loss,
        }

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

    def _critique_step(self, step: int) -> dict[str, Any]:
        """Critique-RL: the frozen actor answers ``tasks_per_step`` train problems, the critic
        critiques each answer ``critiques_per_answer`` times, the actor refines; the
        critiques' stage rewards become RLOO advantages for a PPO update of the critic."""
        stage = stage_of(step - self.config.bc_steps, self.config.stage1_steps)
        if stage == 2 and self._reference is None:
            self._reference = self._stage1_reference()
        rng = random.Random(self.config.seed * 1_000_003 + step)  # same problems after a resume
        problems = rng.sample(self.train_problems, min(self.config.tasks_per_step, len(self.train_problems)))
        start = time.perf_counter()
        shard = critique_round(
            self.actor,
            self.generator,
            self.dp.shard(problems),
            self._sampling(),
            n_critiques=self.config.critiques_per_answer,
        )
        records = self.dp.gather(self._run(shard))
        rewards = stage_rewards(records, stage, self.config.stage2_beta)
        advantages = ALGORITHMS["critique-rl"].advantages(
            rewards, rloo_groups(len(records), self.config.critiques_per_answer)
        )
        samples = [r.critic_sample(self.policy.prompt_ids(r.critic_prompt)) for r in records]
        record = {
            "step": step,
            "phase": f"critique-{stage}",
            "critiques": len(records),
            "reward_mean": _mean(rewards.tolist()),
            **critique_metrics(r.outcome for r in records),
            "rollout_s": round(time.perf_counter() - start, 2),
        }
        start = time.perf_counter()
        record.update(self._update_on(collate(samples, advantages.tolist(), self.pad_id)))
        record["update_s"] = round(time.perf_counter() - start, 2)
        return record

    def _stage1_reference(self) -> list[torch.Tensor]:
        """The critic's trainable weights at the end of Stage I, kept in the run folder so a
        run resumed in Stage II keeps the same reference."""
        path = self.run_dir.path / "stage1-reference.pt"
        if path.exists():
            return [t.to(self.device) for t in torch.load(path)]
        snapshot = [p.detach().clone() for p in self._trainable]
        if self.dp.main:
            torch.save([t.cpu() for t in snapshot], path)
        return snapshot

    def _critique_demos(self) -> list[dict[str, Any]]:
        """Synthetic critiques of ``bc_episodes`` train problems, built once per run."""
        if getattr(self, "_demos", None) is None:
            problems = self.train_problems[: self.config.bc_episodes]
            end_id = TokenizedExpert(self.tokenizer).end_id
            self._demos = demonstrations(problems, self.policy, end_id, self.config.seed)
        return self._demos

    def _evaluate_critic(self) -> dict[str, Any]:
        """Greedy critique rounds on the first ``eval_tasks`` test problems: every
        :func:`~agentgym.critique.critique_metrics` figure as ``eval_<name>``, and Acc@Refine as
        ``eval_success_rate`` (the actor's success with the critic in the loop)."""
        problems = self.test_problems[: self.config.eval_tasks]
        records = self._run(critique_round(self.actor, self.generator, problems, self._sampling(greedy=True)))
        metrics = critique_metrics(r.outcome for r in records)
        return {f"eval_{key}": value for key, value in metrics.items()} | {
            "eval_success_rate": metrics["acc_refine"]
        }

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
        """This rank's micro-batches of ``minibatch`` (all of them in one process), each
        weighted by its share of the whole minibatch; gradients summed over ranks."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(())
        for index in self.dp.shard(self._micro_batches(minibatch)):
            share = len(index) / len(minibatch)
            loss = loss_fn(minibatch.select(index).trimmed().to(self.device)) * share
            loss.backward()
            total += loss.detach().cpu()
        self.dp.sum_gradients(self._trainable)
        torch.nn.utils.clip_grad_norm_(self._trainable, self.config.max_grad_norm)
        self.optimizer.step()
        self.model.eval()
        return self.dp.sum(total.to(self.device)).item()

    def _micro_batches(self, minibatch: TokenBatch) -> tuple[torch.Tensor, ...]:
        return minibatch.by_length().split(self.config.micro_batch_size)

    def _reference_logp(self, micro: TokenBatch) -> torch.Tensor:
        """Log-probs under the initial policy: the base model with the adapters switched off
        (Critique-RL Stage II: under the Stage-I critic)."""
        if self._reference is not None:
            with torch.no_grad(), swapped_weights(self._trainable, self._reference):
                return self._logprobs(micro)[0]
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
        return collate([_tokens(t) for t in trajectories], weights, self.pad_id)

    # ----- rollouts: sync, one step ahead, paused and resumed -----------------------------

    def _rollouts_for(self, step: int) -> tuple[list[Trajectory], float]:
        """Step ``step``'s ended episodes (all ranks') and the collection's wall time."""
        pending, self._pending = self._pending, None
        if pending is None:
            self._run(self._publish())
            local, seconds = self._run(self._collect(step))
        else:  # async: launched during the last step, for this one
            local, seconds = self._run(_result_of(pending))
        trajectories = self.dp.gather(local)
        # Every rank builds the same batch from every rank's episodes, so each learns of
        # the paused episodes any rank dropped (their groups then complete without them).
        dropped, self._dropped_here = self.dp.gather(self._dropped_here), []
        for task_id, sample in dropped:
            self._groups.abandon(task_id, sample)
        self._dropped_paused += len(dropped)
        if self.dp.main:
            folder = self.run_dir.path / "rollouts"
            folder.mkdir(exist_ok=True)
            with TrajectoryWriter(folder / f"step-{step:06d}.jsonl", fsync=False) as writer:
                for trajectory in trajectories:
                    writer.write(trajectory)
        return trajectories, seconds

    def _launch_collection(self, step: int) -> None:
        """Async mode: bring the generator to the current version, then let it play step
        ``step``'s episodes on the event loop while this step updates."""
        self._run(self._publish())
        self._pending = self._loop.get_loop().create_task(self._collect(step))

    async def _collect(self, step: int) -> tuple[list[Trajectory], float]:
        """Play this rank's share of step ``step``'s new groups, resuming paused episodes
        first (partial rollouts); returns the episodes that ended and the wall time."""
        start = time.perf_counter()
        rng = random.Random(self.config.seed * 1_000_003 + step)  # same tasks after a resume
        tasks = rng.sample(self.train_tasks, min(self.config.tasks_per_step, len(self.train_tasks)))
        size = self.config.group_size
        specs = [  # each rank plays whole groups: those of every world-th task
            # Samples are numbered through the run, so a group stays apart from the same task's later groups.
            EpisodeSpec(task, sample=(step - 1) * size + k, split="train")
            for task in self.dp.shard(tasks)
            for k in range(size)
        ]
        rollout = self._rollout_config(self._horizon(step))
        if self.rollouts is None:  # a pool of remote rollout workers (RayRollouts)
            ended = await self.generator.play(self.url, specs, rollout)
        else:
            await self._drop_stale_paused(train_version=step - 1)
            ended = await self.rollouts.play(
                specs, config=rollout, token_budget=self.config.partial_rollout_tokens
            )
        return ended, time.perf_counter() - start

    async def _drop_stale_paused(self, train_version: int) -> None:
        """Paused episodes whose first tokens would train more than ``max_staleness``
        versions late end here; their groups complete without them."""
        stale = [
            episode
            for episode in self.rollouts.paused
            if episode.oldest_version is not None
            and train_version - episode.oldest_version > self.config.max_staleness
        ]
        self._dropped_here += [(episode.spec.task_id, episode.spec.sample) for episode in stale]
        await self.rollouts.drop(stale)

    async def _publish(self) -> None:
        """Give a separate generator the trainer's current weights, tagged with their
        version, before it samples again (the in-process policy samples them already)."""
        if self.generator is self.policy or self._published == self.version:
            return
        if isinstance(self.generator, HFPolicy):  # async mode's in-process copy: the trainable tensors
            state = {
                name.removeprefix("base_model.model."): p.detach().clone()
                for name, p in self._named_trainable()
            }
            self.generator.update_weights(state, strict=False, version=self.version)
        else:
            await self.generator.update_weights(_merged_weights(self.model), version=self.version)
        self._published = self.version

    def _in_background(self, work: Any, *args: Any) -> Any:
        """Run ``work`` here in sync mode; in async mode in a worker thread, so the event
        loop goes on playing the episodes of the next step meanwhile."""
        if self._pending is None:
            return work(*args)
        return self._run(asyncio.to_thread(work, *args))

    def _rollout_config(self, max_turns: int, *, greedy: bool = False) -> RolloutConfig:
        return RolloutConfig(
            max_turns=max_turns,
            sampling=self._sampling(greedy),
            concurrency=self.config.concurrency,
            format=self.config.agent_format,
        )

    def _sampling(self, greedy: bool = False) -> SamplingParams:
        """Rollout sampling (greedy for evaluation). No per-request seed: the samples of a
        group, and the critiques of one answer, must differ (one shared seed makes them
        identical)."""
        temperature = 0.0 if greedy else self.config.temperature
        return SamplingParams(temperature=temperature, max_new_tokens=self.config.max_new_tokens)

    def _horizon(self, step: int) -> int:
        if self.config.algo == "agentevol":
            return self.config.max_turns
        return self.schedule.horizon_at(step - self.config.bc_steps)

    def _evaluate(self) -> float:
        """Greedy success rate on the first ``eval_tasks`` test tasks at the final horizon."""
        tasks = self.test_tasks[: self.config.eval_tasks]
        final_horizon = self._horizon(self.config.bc_steps + max(1, self.rl_steps))
        # Async: the generator is busy with the next step's episodes and one version behind.
        trajectories = self._play(
            self.policy if self.config.mode == "async" else self.generator,
            [EpisodeSpec(t, split="test") for t in tasks],
            self._rollout_config(final_horizon, greedy=True),
        )
        return _mean(float(t.success) for t in trajectories)

    def _expert_dataset(self) -> list[Trajectory]:
        """Expert episodes on train tasks, collected once per run and kept in the run folder."""
        if getattr(self, "_expert", None) is not None:
            return self._expert
        path = self.run_dir.path / "expert.jsonl"
        if self.dp.main and (not path.exists() or not read_trajectories(path)):
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
        self.dp.barrier()  # the other ranks read what rank 0 wrote
        self._expert = read_trajectories(path)
        if not self._expert:
            raise RuntimeError("the expert solved no train task: nothing to clone")
        return self._expert

    def _play(self, policy: Any, specs: list[EpisodeSpec], rollout: RolloutConfig) -> list[Trajectory]:
        if policy is self.generator:
            self._run(self._publish())
        if hasattr(policy, "play"):  # a pool of remote rollout workers (RayRollouts)
            return self._run(policy.play(self.url, specs, rollout))
        return self._run(run_episodes(self.url, policy, specs, rollout))

    def _run(self, coroutine: Any) -> Any:
        return self._loop.run(coroutine)

    def _start_generator(self) -> Any:
        """What samples rollouts, and the state rollouts keep across steps: paused
        episodes (partial rollouts), groups waiting for them, the replay buffer."""
        generator = self._new_generator()
        self._cleanup.push_async_callback(generator.close)
        self._published = self.version if generator is self.policy else None
        self._pending: asyncio.Task | None = None
        """Async mode: the collection of the next step's episodes, in flight."""
        self._groups = PendingGroups(self.config.group_size)
        self._dropped_paused = 0
        """Paused episodes ended so far (on every rank) because they would train too stale."""
        self._dropped_here: list[tuple[str, int]] = []
        """(task, sample) of the paused episodes this rank dropped since the last collection."""
        self.replay = ReplayBuffer(self.config.replay_capacity, self.config.max_staleness)
        checkpoint = self.run_dir.latest_checkpoint() if self.resume else None
        if checkpoint is not None and (checkpoint / REPLAY_FILE).exists():
            self.replay.load(checkpoint / REPLAY_FILE)
        self.rollouts = None if hasattr(generator, "play") else Rollouts(self.url, generator)
        if self.rollouts is not None:
            self._run(self._cleanup.enter_async_context(self.rollouts))
        return generator

    def _new_generator(self) -> Any:
        """The trained model itself (sync, in-process), or a separate generator sent the
        weights before it next samples: an in-process copy (async), vLLM or Ray workers."""
        if self.config.generator != "hf" and self.dp.world > 1:
            raise ValueError(
                f"generator: {self.config.generator} runs with one trainer process; use --nproc 1"
            )
        if self.config.generator == "hf":
            return self.policy if self.config.mode == "sync" else self._policy_copy()
        if self.config.generator == "ray":
            from agentgym.trainers.ray_rollouts import RayRollouts

            return RayRollouts(
                self.config.model, self.url, workers=self.config.ray_workers, address=self.config.ray_address
            )
        from agentgym.policies.vllm import VLLMPolicy

        return VLLMPolicy(
            self.config.model,
            dtype="bfloat16" if self._dtype() == torch.bfloat16 else "auto",
            gpu_memory_utilization=self.config.vllm_gpu_memory_utilization,
        )

    def _policy_copy(self) -> HFPolicy:
        """A second in-process policy with the trainer's structure (adapters included), so
        async rollouts sample from published weights while the trainer's change."""
        copy = HFPolicy(self.config.model, dtype=self._dtype(), device=self.dp.device())
        self._adapt(copy.model)
        return copy

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
        self.policy = HFPolicy(self.config.model, dtype=self._dtype(), device=self.dp.device())
        self.tokenizer = self.policy.tokenizer
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self.device = self.policy.device
        # Adapters are injected into the policy's own modules, so generation samples from
        # the weights being trained: no copy, no transfer on one device.
        model = self._adapt(self.policy.model)
        self.model = model
        self._trainable = [p for p in model.parameters() if p.requires_grad]
        self._initial = {k: v.detach().clone() for k, v in self._named_trainable()}
        self.optimizer = torch.optim.AdamW(
            self._trainable, lr=self.config.learning_rate, weight_decay=self.config.weight_decay
        )
        with EnvClient(self.url) as client:
            self.train_tasks = [t.task_id for t in client.tasks(split="train", limit=10_000).tasks]
            self.test_tasks = [t.task_id for t in client.tasks(split="test", limit=10_000).tasks]
        if self.critique:
            # The problems behind the server's task ids (same env settings, same problems).
            catalog = registry.make(self.config.env, **self.config.env_settings)
            self.train_problems = [catalog.problem(t) for t in self.train_tasks]
            self.test_problems = [catalog.problem(t) for t in self.test_tasks]
            self.actor = BaseModelActor(self.policy, self.model)

    def _adapt(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` with its trainable parameters: LoRA adapters injected (in place), or all."""
        if not self.config.lora:
            return model.requires_grad_(True)
        from peft import LoraConfig, get_peft_model

        return get_peft_model(
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

    def _named_trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, p) for name, p in self.model.named_parameters() if p.requires_grad]

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
        checkpoint = self.run_dir.latest_checkpoint() if self.resume else None
        if checkpoint is None:
            if self.dp.main:
                self.config.save(self.run_dir.path / "config.yaml")
            return 1
        state = RunDir.load_checkpoint(checkpoint, self.model, self.optimizer)
        log.info("resumed from %s (step %d)", checkpoint, state["step"])
        return state["step"] + 1

    def _dtype(self) -> torch.dtype | None:
        if self.config.bf16 and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
            return torch.bfloat16
        return None


def _merged_weights(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The model's weights under their Hugging Face names, LoRA adapters merged in: what a
    separate generator (vLLM) loads. Copies, because the adapters are taken out again."""
    lora = hasattr(model, "merge_adapter")
    if not lora:
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


def _tokens(trajectory: Trajectory) -> dict[str, Any]:
    """A trajectory as a ``collate`` record."""
    return {
        "token_ids": trajectory.token_ids,
        "loss_mask": trajectory.loss_mask,
        "logprobs": trajectory.logprobs,
    }


async def _result_of(task: asyncio.Task) -> Any:
    return await task


def _idle_share(since: Any) -> float:
    """Share of the machine's CPU time idle since the ``psutil.cpu_times()`` ``since``."""
    now = psutil.cpu_times()
    spent = {field: getattr(now, field) - getattr(since, field) for field in now._fields}
    total = sum(spent.values())
    idle = spent["idle"] + spent.get("iowait", 0.0)
    return round(idle / total, 3) if total > 0 else 0.0


def _ratio_figures(ratios: list[torch.Tensor]) -> dict[str, float]:
    """The importance ratio π_θ/π_behaviour over the update's agent tokens: quantiles and max."""
    values = torch.cat(ratios).float() if ratios else torch.ones(1)
    quantiles = torch.quantile(values, torch.tensor([0.05, 0.5, 0.95]))
    return {
        "ratio_p05": round(float(quantiles[0]), 4),
        "ratio_p50": round(float(quantiles[1]), 4),
        "ratio_p95": round(float(quantiles[2]), 4),
        "ratio_max": round(float(values.max()), 4),
    }


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
    if record["phase"].startswith("critique"):
        return f"{record['phase']}  acc@dis {record['acc_dis']:.2f}"
    return f"rl  success {record['success_rate']:.2f} turns≤{record['max_turns']}"


def _progress(visible: bool = True) -> Progress:
    return Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not visible,
    )
