"""TRL's ``rollout_func`` over our env servers: each prompt is a train task id, each
completion one whole episode, played by our rollout engine with the model TRL trains.

TRL hands the function its slice of the generation batch, each task repeated ``group_size``
times in a row, and takes back token ids. Ours are exact: the episode's own tokens (no
re-tokenisation), the prompt up to the first reply, the completion from there to the end
with the observations in it masked out (``env_mask``), every reply ending on the model's
end-of-turn token unless it was cut at ``max_new_tokens`` (which TRL then counts as
truncated, as it is). Replies are drawn under the constrained decoder when the run
constrains actions; the batch remembers which ids each constrained token was drawn among
(:class:`PlayedBatch`), so the learner scores it under the same mask.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from agentgym.play.episode import EpisodeSpec
from agentgym.play.rollout import run_episodes
from agentgym.policies.hf import HFPolicy
from agentgym.policies.models import LoadedModel, ModelSource
from agentgym.records.trajectory import Trajectory
from agentgym.trainers.batch import allowed_at_positions
from agentgym.trainers.collector import rollout_config, sampling
from agentgym.trainers.schedules import schedule_of


@dataclass
class PlayedBatch:
    """One call's episodes, in the order of its prompts, and what scoring them needs."""

    episodes: list[Trajectory]
    prompt_lengths: list[int]
    """Where each episode's completion starts in its ``token_ids`` (0 for an errored one)."""
    allowed: list[Tensor]
    """Per episode ``[completion tokens, K]``: the ids each constrained token was drawn
    among, -1 padded; all -1 on free tokens and observations."""
    step: int
    """Our training step this generation round is (:func:`rl_step`)."""
    max_turns: int
    rollout_s: float
    """The round's wall time to play its episodes."""

    def allowed_tensor(self, width: int) -> Tensor:
        """``[B, width, K]``: :attr:`allowed` right-padded as TRL pads completions."""
        depth = max((a.shape[1] for a in self.allowed), default=1)
        out = torch.full((len(self.allowed), width, depth), -1, dtype=torch.long)
        for row, ids in enumerate(self.allowed):
            out[row, : ids.shape[0], : ids.shape[1]] = ids
        return out


def optimizer_steps_per_round(trainer: Any) -> int:
    """TRL's optimizer steps between two generation rounds: ``steps_per_generation ×
    num_iterations`` micro-steps, a whole number of optimizer steps (:func:`~.build.grpo_args`
    sees to it)."""
    args = trainer.args
    return args.steps_per_generation * trainer.num_iterations // args.gradient_accumulation_steps


def rl_step(trainer: Any) -> int:
    """Our step number (from 1: one batch of episodes and the updates made from it) for
    TRL's next generation round."""
    return trainer.state.global_step // optimizer_steps_per_round(trainer) + 1


class EnvEpisodes:
    """The ``rollout_func``: plays each prompt's task on the env server at ``url``, at the
    horizon our schedule gives the round (ScalingInter-RL's turn limit, enforced by the
    rollout engine), and keeps the round's :class:`PlayedBatch` in :attr:`last`."""

    def __init__(self, config: Any, url: str, source: ModelSource) -> None:
        self.config, self.url = config, url
        self.source = source
        """Where the trained model's starting weights came from (for results files)."""
        self.schedule = schedule_of(config)
        self.last: PlayedBatch | None = None
        self._policy: HFPolicy | None = None

    def __call__(self, prompts: Sequence[str], trainer: Any) -> dict[str, list]:
        step = rl_step(trainer)
        horizon = self.schedule.horizon_at(step)
        specs = episode_specs(prompts)
        policy = self.policy_for(trainer)
        rollout = rollout_config(self.config, horizon, sampling(self.config))
        started = time.perf_counter()
        with playing(policy, trainer):
            played = asyncio.run(run_episodes(self.url, policy, specs, rollout))
        by_key = {episode.key: episode for episode in played}
        episodes = [by_key[(spec.task_id, spec.sample)] for spec in specs]
        self.last = PlayedBatch(episodes, [], [], step, horizon, round(time.perf_counter() - started, 2))
        return self._completions(episodes, policy.end_id)

    def _completions(self, episodes: list[Trajectory], end_id: int) -> dict[str, list]:
        out: dict[str, list] = collections.defaultdict(list)
        for episode in episodes:
            usable = not episode.errored and episode.token_ids and any(episode.loss_mask)
            start = episode.loss_mask.index(1) if usable else 0
            ids, mask = (episode.token_ids, episode.loss_mask) if usable else ([end_id], [0])
            logprobs = episode.logprobs if usable else [0.0]
            out["prompt_ids"].append(ids[:start] if usable else [end_id])
            out["completion_ids"].append(ids[start:])
            out["env_mask"].append(mask[start:])
            out["logprobs"].append([lp * m for lp, m in zip(logprobs[start:], mask[start:], strict=True)])
            # None: TRL counts the episode unscorable (no advantage), as our trainer drops it.
            out["env_reward"].append(episode.score if usable else None)
            out["turns"].append(episode.turns)
            self.last.prompt_lengths.append(start)
            self.last.allowed.append(
                completion_allowed(ids, mask, episode.reply_choices if usable else None, start)
            )
        return dict(out)

    def policy_for(self, trainer: Any) -> HFPolicy:
        """Our batcher over TRL's own model (unwrapped from accelerate's wrapper): no copy,
        so every round samples from the weights TRL just stepped."""
        if self._policy is None:
            model = trainer.accelerator.unwrap_model(trainer.model)
            loaded = LoadedModel(model, trainer.processing_class, self.source)
            self._policy = HFPolicy.around(loaded, self.config.model, max_batch_size=self.config.concurrency)
        return self._policy

    def close(self) -> None:
        """Stop the batcher's thread (the model stays TRL's)."""
        if self._policy is not None:
            asyncio.run(self._policy.close())
            self._policy = None


def episode_specs(prompts: Sequence[str]) -> list[EpisodeSpec]:
    """One spec per prompt; a task's repeats (its group) are samples 0, 1, ... of it."""
    seen: collections.Counter[str] = collections.Counter()
    specs = []
    for task_id in prompts:
        specs.append(EpisodeSpec(task_id, sample=seen[task_id], split="train"))
        seen[task_id] += 1
    return specs


def completion_allowed(
    token_ids: Sequence[int], loss_mask: Sequence[int], reply_choices: Any, start: int
) -> Tensor:
    """``[len(token_ids) - start, K]``: the ids each completion token was drawn among."""
    positions = allowed_at_positions(token_ids, loss_mask, reply_choices)
    depth = max((len(ids) for ids in positions.values()), default=1)
    allowed = torch.full((len(token_ids) - start, depth), -1, dtype=torch.long)
    for position, ids in positions.items():
        allowed[position - start, : len(ids)] = torch.tensor(ids)
    return allowed


@contextlib.contextmanager
def playing(policy: HFPolicy, trainer: Any) -> Iterator[None]:
    """The model whole and in eval mode while it plays (TRL keeps it in train mode), tokens
    tagged with TRL's optimizer step count as their weights version.

    Whole as TRL's own HF generation has it: under DeepSpeed ZeRO-3 the shards are gathered
    into every process for the round (``ds3_gather_for_generation``), under FSDP the full
    parameters are summoned; on one process or under DDP both are no-ops. Our batcher runs
    its forwards when its requests come, not in step with the other processes, so the
    per-layer gathers ZeRO-3 would otherwise make inside each forward must not happen."""
    from trl.distributed import DistributedBackend
    from trl.models import unwrap_model_for_generation

    model = policy.model
    was_training = model.training
    policy.weights_version = trainer.state.global_step
    whole = unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    )
    full = DistributedBackend(trainer.accelerator).summon_full_params(trainer.model_wrapped, recurse=False)
    with whole, full:
        model.eval()
        try:
            yield
        finally:
            model.train(was_training)


def env_reward(completions: list[Any], env_reward: list[float | None], **_: Any) -> list[float | None]:
    """TRL's reward function: the env's score of each episode, as our rollout recorded it."""
    return env_reward
