"""Our algorithms inside TRL's ``GRPOTrainer``.

TRL keeps the loop it scales with (accelerate, DeepSpeed, FSDP, its optimizer, schedules,
checkpoints); four hooks make the update ours:

- **advantages** come from the run's estimator (``advantage``: GRPO's, RLOO's, GiGPO's
  per-turn ones, ...), over the episodes of every rank, replacing TRL's group z-score;
- **the ratio bounds** come from the run's clip rule, once per optimizer step: BAPO's
  search runs on all the step's micro-batches of every rank under the current weights, as
  our learner's does, and sets TRL's ``epsilon_low``/``epsilon_high``; dual-clip is TRL's
  ``delta`` (the same loss while the high bound stays under it, which is checked);
- **log-probs** are the acting policy's: a constrained token is scored under the mask it
  was drawn with (TRL's own scoring uses the whole vocabulary, so its ratios would not be
  the sampler's), scored on agent tokens only;
- **the loss** is our learner's: TRL's ``dapo`` token sum, normalised by the optimizer
  step's own agent tokens over all ranks (TRL divides by the generation batch's average),
  plus the forced-end and entropy terms as ``update.py`` adds them.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate.utils import gather_object
from torch import Tensor
from trl import GRPOTrainer

from agentgym.policies.chat import stop_token_ids
from agentgym.trainers.algorithms import ADVANTAGE_ESTIMATORS, CLIP_RULES, Prepass
from agentgym.trainers.batch import TokenScores, per_token, sequence_logprobs
from agentgym.trainers.trl_engine.episodes import EnvEpisodes, PlayedBatch, env_reward
from agentgym.trainers.update import carries_advantage, loss_reads_only_advantage_rows, rows_to_run


class AgentGymGRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` playing episodes with :class:`EnvEpisodes` and updating by ``config``'s
    algorithm (a :class:`~agentgym.trainers.config.TrainConfig`)."""

    def __init__(self, *, config: Any, episodes: EnvEpisodes, **kwargs: Any) -> None:
        super().__init__(rollout_func=episodes, reward_funcs=[env_reward], **kwargs)
        self.agentgym_config = config
        # A reply ends on any of our stop tokens (SmolLM2's <|im_end|> is not its eos): TRL
        # counts a completion ending elsewhere as truncated.
        self.eos_token_ids = sorted(set(self.eos_token_ids) | stop_token_ids(self.processing_class))
        self.episodes = episodes
        self._scoring: tuple[Tensor, Tensor] | None = None
        """``(allowed [B, C, K], agent [B, C])`` of the rows the next log-prob pass scores."""
        self._scores: TokenScores | None = None
        self._step_tokens = 1.0
        self._behaviour: Tensor | None = None
        """The sampler's log-probs of the round just played, until TRL asks for old ones."""
        self._sampled_at = -1
        """TRL's optimizer step count when the round was sampled (its weights are those)."""

    # ----- the round's episodes -----------------------------------------------------------

    def _generate(self, prompts: list) -> tuple:
        result = super()._generate(prompts)
        played = self.episodes.last
        completion_ids, env_mask = result[1], result[2]
        width = max(len(ids) for ids in completion_ids)
        agent = torch.zeros(len(completion_ids), width)
        for row, mask in enumerate(env_mask):
            agent[row, : len(mask)] = torch.tensor(mask, dtype=torch.float)
        self._scoring = (played.allowed_tensor(width), agent)  # TRL's old and reference log-probs
        self._sampled_at = self.state.global_step
        if self._recomputes_old_logps():
            behaviour = torch.zeros(len(completion_ids), width)
            for row, logprobs in enumerate(result[4]):
                behaviour[row, : len(logprobs)] = torch.tensor(logprobs)
            self._behaviour = behaviour
        return result

    def _recomputes_old_logps(self) -> bool:
        """Whether TRL is about to score the round for old log-probs (generation and update
        out of step, as in ``_generate_and_score_completions``). Our sampler recorded them
        already, under the mask it drew with, as our learner uses them: that pass is
        answered from them instead of a forward over the whole round."""
        every = self.args.steps_per_generation * self.num_iterations
        return self.args.gradient_accumulation_steps % every != 0 and not self.use_vllm

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        played = self.episodes.last
        width = output["completion_ids"].shape[1]
        device = output["completion_ids"].device
        output["advantages"] = self._advantages(played, width).to(device)
        output["allowed"] = played.allowed_tensor(width).to(device)
        self._metrics["train"]["max_turns"].append(float(played.max_turns))
        return output

    def _advantages(self, played: PlayedBatch, width: int) -> Tensor:
        """``[B, width]`` per completion token: the run's estimator over the episodes of
        every rank (a group may span ranks), each group ``num_generations`` rows in a row
        as TRL's sampler lays them out; errored episodes get 0, as our trainer drops them."""
        every = gather_object(list(played.episodes))
        usable = [i for i, e in enumerate(every) if not e.errored and e.token_ids]
        group_ids = torch.tensor([i // self.num_generations for i in usable])
        estimated = ADVANTAGE_ESTIMATORS[self.agentgym_config.advantage](
            [every[i] for i in usable], group_ids
        )
        by_row = dict(zip(usable, estimated, strict=True))
        first = self.accelerator.process_index * len(played.episodes)
        out = torch.zeros(len(played.episodes), width)
        for row, (episode, start) in enumerate(zip(played.episodes, played.prompt_lengths, strict=True)):
            if (advantage := by_row.get(first + row)) is not None:
                values = per_token(advantage, episode.loss_mask)[start:]
                out[row, : len(values)] = torch.tensor(values)
        return out

    # ----- log-probs under the sampler's mask -------------------------------------------

    def _get_per_token_logps_and_entropies(
        self,
        model: Any,
        input_ids: Tensor,
        attention_mask: Tensor,
        logits_to_keep: int,
        batch_size: int | None = None,
        compute_entropy: bool = False,
        compute_aux_loss: bool = False,
        **_: Any,
    ) -> tuple[Tensor, Tensor | None, None]:
        if self._behaviour is not None:  # TRL's old log-probs: the sampler's (_recomputes_old_logps)
            behaviour, self._behaviour = widened(self._behaviour, logits_to_keep), None
            return behaviour.to(input_ids.device), None, None
        allowed, agent = (widened(t, logits_to_keep) for t in self._scoring)
        mass = bool(self.agentgym_config.command_mass_coef)
        scores = self._masked_scores(model, input_ids, attention_mask, allowed, agent, batch_size, mass)
        self._scores = scores
        return scores.logp, scores.entropy if compute_entropy else None, None

    def _masked_scores(
        self, model: Any, input_ids: Tensor, attention_mask: Tensor, allowed: Tensor, agent: Tensor,
        batch_size: int | None = None, with_command_mass: bool = False,
    ) -> TokenScores:  # fmt: skip
        """The scores of :func:`sequence_logprobs` of the completion tokens (the last
        ``agent.shape[1]`` columns), agent tokens only, in chunks of ``batch_size`` rows."""
        columns = agent.shape[1]
        before = input_ids.shape[1] - columns
        positions = torch.nn.functional.pad(agent.to(input_ids.device), (before, 0)).long()
        allowed = torch.nn.functional.pad(allowed.to(input_ids.device), (0, 0, before, 0), value=-1)
        size = batch_size or len(input_ids)
        parts = []
        for rows in torch.arange(len(input_ids)).split(size):
            scores = sequence_logprobs(
                model,
                input_ids[rows],
                attention_mask[rows],
                positions=positions[rows],
                temperature=self.temperature,
                with_entropy=True,
                allowed=allowed[rows],
                with_command_mass=with_command_mass,
            )
            parts.append(scores)
        return TokenScores(
            *(
                None if first is None else torch.cat([p[i][:, before:] for p in parts])
                for i, first in enumerate(parts[0])
            )
        )

    # ----- the loss ---------------------------------------------------------------------

    def _compute_loss(self, model: Any, inputs: dict[str, Any]) -> Tensor:
        if self._step % self.current_gradient_accumulation_steps == 0:  # an optimizer step's first
            self._set_bounds(model)
        config = self.agentgym_config
        if loss_reads_only_advantage_rows(self.beta, config.entropy_coef):
            inputs = carrying_rows(inputs)
        agent = inputs["completion_mask"] * inputs.get("tool_mask", 1)
        self._scoring = (inputs["allowed"], agent)
        loss = super()._compute_loss(model, inputs)
        scores = self._scores
        carries = carries_advantage(inputs["advantages"])
        unaided = scores.unaided_logp(config.forced_end_coef, config.command_mass_coef)
        ours = -config.entropy_coef * scores.entropy - unaided * carries
        # TRL divides its token sum by the generation batch's tokens per optimizer step on
        # average; our learner by this optimizer step's own (ranks' gradients are averaged).
        trl_norm = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        trl_norm = trl_norm * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        own_norm = self._step_tokens / self.accelerator.num_processes
        return loss * trl_norm / own_norm + (ours * agent).sum() / own_norm

    def _set_bounds(self, model: Any) -> None:
        """The clip rule's bounds for the optimizer step starting now, from all its
        micro-batches on every rank (BAPO: one search on the whole minibatch)."""
        spg, steps = self.args.steps_per_generation, self.current_gradient_accumulation_steps
        window = [self._buffered_inputs[(self._step + i) % spg] for i in range(steps)]
        tokens = sum(float((w["completion_mask"] * w.get("tool_mask", 1)).sum()) for w in window)
        here = torch.tensor(tokens, device=self.accelerator.device)
        self._step_tokens = float(self.accelerator.reduce(here, reduction="sum"))
        config = self.agentgym_config
        bounds = CLIP_RULES[config.clip_rule](config, lambda: self._prepass(model, window))
        self.epsilon_low, self.epsilon_high = 1 - bounds.low, bounds.high - 1
        figures = self._metrics["train"]
        figures["clip_low"].append(bounds.low)
        figures["clip_high"].append(bounds.high)
        if bounds.search is not None:  # BAPO: how often its search moved the bounds, and ρ
            figures["bounds_moved"].append(float(bounds.search.steps > 0))
            figures["positive_share"].append(bounds.search.rho)

    def _prepass(self, model: Any, window: list[dict[str, Any]]) -> Prepass:
        """Agent tokens' log-probs under the current weights, behaviour log-probs and
        advantages over ``window``, flattened to ``[1, N]``, summed over ranks by ``reduce``.
        Where TRL kept no old log-probs the window was sampled by the current weights."""
        parts = []
        with torch.no_grad():
            for micro in window:
                agent = (micro["completion_mask"] * micro.get("tool_mask", 1)).bool()
                old = micro.get("old_per_token_logps")
                if old is None:  # generation and update aligned: the ratio is 1 by construction
                    logp = old = torch.zeros_like(agent, dtype=torch.float)
                elif self.state.global_step == self._sampled_at:  # the sampling weights: ratio 1
                    logp = old
                else:
                    ids = torch.cat([micro["prompt_ids"], micro["completion_ids"]], dim=1)
                    mask = torch.cat([micro["prompt_mask"], micro["completion_mask"]], dim=1)
                    logp = self._masked_scores(model, ids, mask, micro["allowed"], agent.float()).logp
                advantages = micro["advantages"].expand_as(agent)
                parts.append((logp[agent], old[agent], advantages[agent]))
        logp, old, advantages = (torch.cat([p[i] for p in parts])[None] for i in range(3))
        return Prepass(
            logp,
            old,
            advantages,
            torch.ones_like(logp),
            lambda t: self.accelerator.reduce(t, reduction="sum"),
        )


def widened(tensor: Tensor, columns: int) -> Tensor:
    """``tensor`` ([B, C] or [B, C, K]) right-padded to ``columns`` columns (TRL may pad
    completions to a multiple of ``pad_to_multiple_of``): 0, or -1 for allowed ids."""
    missing = columns - tensor.shape[1]
    if missing <= 0:
        return tensor
    padding = (0, 0, 0, missing) if tensor.dim() == 3 else (0, missing)
    return torch.nn.functional.pad(tensor, padding, value=-1 if tensor.dim() == 3 else 0)


def carrying_rows(inputs: dict[str, Any]) -> dict[str, Any]:
    """A micro-batch's rows whose advantage is non-zero somewhere, our learner's rule
    (``update.rows_to_run``): without KL or entropy terms the others add exactly nothing
    to the loss or its gradient (their tokens still count in the normaliser, fixed on the
    whole optimizer step), so they are not run."""
    agent_tokens = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).sum(-1)
    carries = rows_to_run(inputs["advantages"], agent_tokens)
    if carries.all():
        return inputs
    rows = len(carries)
    return {
        k: v[carries] if isinstance(v, Tensor) and v.dim() and v.shape[0] == rows else v
        for k, v in inputs.items()
    }
