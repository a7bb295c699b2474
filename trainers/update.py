"""The clipped policy update every clipped-ratio regime runs (``regimes.py``'s
:class:`~agentgym.trainers.regimes.ClippedRL`, Critique-RL): minibatches in a seeded order,
one optimizer step of the clipped surrogate each, under the configured clip rule, and the
figures of what the bounds did. It reads only a narrow :class:`UpdateContext` of the
run, so a benchmark or a test drives it without a running trainer.
"""

from __future__ import annotations

import statistics
from typing import Any, Protocol

import torch

from agentgym.trainers.algorithms import (
    CLIP_RULES,
    Bounds,
    balance,
    clip_fractions,
    clipped_surrogate,
    importance_ratio,
    kl_k3,
)
from agentgym.trainers.batch import TokenBatch
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner


class UpdateContext(Protocol):
    """What an update reads of the run."""

    config: Any
    learner: Learner
    dp: DataParallel

    @property
    def version(self) -> int:
        """The policy weights version (seeds the minibatch order)."""
        ...

    def minibatch(self, batch: TokenBatch) -> TokenBatch:
        """``batch`` as one optimizer step's minibatch, its token weights fixed."""
        ...


def update_policy(
    run: UpdateContext, batch: TokenBatch, kl_coef: float, sampled_now: bool = False
) -> dict[str, Any]:
    """``ppo_epochs`` passes over ``batch``, one clipped-surrogate optimizer step per minibatch.
    ``sampled_now``: the current weights sampled all of ``batch`` (until the first step)."""
    config = run.config
    updates, tokens, skipped = [], 0, 0
    advantage_only = loss_reads_only_advantage_rows(kl_coef, config.entropy_coef)
    for index in minibatch_order(len(batch), config, run.version):
        minibatch = run.minibatch(batch.select(index))
        if advantage_only:
            minibatch, dropped = carrying_gradient(minibatch)
            skipped += dropped
        tokens += int(minibatch.attention_mask.sum())
        update = clipped_update(run, minibatch, kl_coef, on_policy=sampled_now and not updates)
        update["advantage_rows"] = int(carries_advantage(minibatch.advantages).sum())
        if advantage_only and not update["advantage_rows"]:
            # Only carrying_gradient's stand-in row ran: its entropy says nothing of the policy
            # (a short, mostly forced reply reads as a collapse to the guard). With a KL or
            # entropy term every row ran, and the reading is the policy's.
            update.pop("entropy")
        updates.append(update)
    return summarize(updates) | {
        "update_tokens": tokens,
        "skipped_episodes": skipped,
        "zero_advantage_share": round(float((batch.advantages == 0).all(dim=1).float().mean()), 4),
        "updates": updates,
    }


def minibatch_order(episodes: int, config: Any, version: int) -> list[torch.Tensor]:
    """Each epoch's shuffled minibatches of episode indices. The shuffle is seeded from the
    run's seed and the policy version, not torch's global RNG: every data-parallel rank
    builds the same minibatches (their global RNGs part ways as soon as rank 0 alone
    evaluates), and a resumed run replays the order it would have taken."""
    shuffle = torch.Generator().manual_seed(config.seed * 1_000_003 + version)
    return [
        index
        for _ in range(config.ppo_epochs)
        for index in torch.randperm(episodes, generator=shuffle).split(config.minibatch_size)
    ]


def summarize(updates: list[dict[str, Any]]) -> dict[str, Any]:
    """A step's figures over its updates: each number's mean over the updates that have it,
    and how each BAPO search ended (``bapo_search``: outcome -> updates)."""
    keys = dict.fromkeys(key for update in updates for key in update)
    summary: dict[str, Any] = {}
    for key in keys:
        values = [u[key] for u in updates if isinstance(u.get(key), int | float)]
        if values:
            summary[key] = statistics.fmean(values)
    outcomes = [u["bapo_search"] for u in updates if "bapo_search" in u]
    if outcomes:
        summary["bapo_search"] = {o: outcomes.count(o) for o in dict.fromkeys(outcomes)}
    return summary


def loss_reads_only_advantage_rows(kl_coef: float, entropy_coef: float) -> bool:
    """Whether the loss reads only rows with a non-zero advantage: without a KL or entropy
    term a row whose advantage is 0 on every token adds exactly nothing to the loss or its
    gradient (docs/algorithms/grpo.md, "The loss"). Our learner and the TRL plug-in both
    skip such rows by this one rule."""
    return not kl_coef and not entropy_coef


def carrying_gradient(minibatch: TokenBatch) -> tuple[TokenBatch, int]:
    """The rows of a weighted minibatch that carry gradient, and how many were left out.
    Without KL or entropy terms an episode whose advantage is 0 on every token adds exactly
    nothing to the gradient (its tokens still count in the token weights, fixed before
    this), so it is not run forward and backward: on a CPU that halves steps where whole
    groups agree. When no row carries gradient one stays, so the optimizer steps as it
    would have (Adam's momentum still moves the weights)."""
    kept = rows_to_run(minibatch.advantages, minibatch.attention_mask.sum(-1)).nonzero().squeeze(1)
    return minibatch.select(kept), len(minibatch) - len(kept)


def rows_to_run(advantages: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: the rows that carry an advantage or, when none does, the shortest row
    alone, so that every rank still runs a backward pass and the optimizer steps."""
    carries = carries_advantage(advantages).squeeze(1)
    if not carries.any():
        carries[lengths.argmin()] = True
    return carries


def carries_advantage(advantages: torch.Tensor) -> torch.Tensor:
    """``[B, 1]`` bool: the rows whose advantage is non-zero on some token. Zero-advantage
    rows carry only the KL and entropy terms (docs/algorithms/grpo.md, "The loss")."""
    return (advantages != 0).any(dim=1, keepdim=True)


def clipped_update(
    run: UpdateContext, minibatch: TokenBatch, kl_coef: float, on_policy: bool = False
) -> dict[str, float]:
    """One optimizer step of ``-min(r·A, clip(r)·A) - entropy_coef·H + kl_coef·KL -
    forced_end_coef·log π_free(forced end) - command_mass_coef·log π_free(allowed)`` with the
    bounds of the configured clip rule; figures summed over every micro-batch and rank."""
    config, learner = run.config, run.learner
    bounds = CLIP_RULES[config.clip_rule](config, lambda: learner.prepass(minibatch, on_policy))
    # Σw·H, P, N, held low, held high, tokens, ΣKL behaviour→current, Σw, ΣKL to the reference, forced
    sums = torch.zeros(10, device=learner.device)
    ratios: list[torch.Tensor] = []

    def per_token_loss(micro: TokenBatch) -> torch.Tensor:
        scores = learner.logprobs(micro, with_entropy=True, with_command_mass=bool(config.command_mass_coef))
        logp, entropy = scores.logp, scores.entropy
        loss = clipped_surrogate(
            logp,
            micro.old_logp,
            micro.advantages,
            clip_low=bounds.low,
            clip_high=bounds.high,
            dual_clip=config.dual_clip,
        )
        # The end token the constrained decoder forced after a complete command carries no RL
        # gradient; without this term the model loses the habit of ending a reply by itself and
        # runs on outside the decoder (`take iron take iron ...`; bench/RESULTS.md). The
        # surrogate, renormalised over the allowed ids, leaves the mass outside them free to
        # grow as well: the command-mass term keeps free generation on the commands. Both ride
        # on the episodes the surrogate trains (a non-zero advantage), under every algorithm,
        # so leaving the others out (`carrying_gradient`) never changes the loss.
        unaided = scores.unaided_logp(config.forced_end_coef, config.command_mass_coef)
        loss = loss - config.entropy_coef * entropy - unaided * carries_advantage(micro.advantages)
        kl_ref = kl_k3(logp, learner.reference_logprobs(micro)) if kl_coef else torch.zeros_like(logp)
        loss = loss + kl_coef * kl_ref
        with torch.no_grad():
            ratio = importance_ratio(logp, micro.old_logp)
            sums.add_(update_sums(micro, ratio, logp, entropy, bounds, kl_ref))
            ratios.append(ratio[micro.loss_mask.bool()].float().cpu())
        return loss

    loss = learner.optimize(minibatch, per_token_loss)
    (
        weighted_entropy,
        positive,
        negative,
        held_low,
        held_high,
        tokens,
        kl_drift,
        weight,
        kl_ref_sum,
        forced,
    ) = run.dp.sum(sums).tolist()
    entropy = weighted_entropy / weight if weight else 0.0
    return {
        **bound_figures(bounds, positive, negative),
        "clip_frac_low": held_low / max(tokens, 1),
        "clip_frac_high": held_high / max(tokens, 1),
        "approx_kl": kl_drift / max(tokens, 1),
        **({"kl_ref": kl_ref_sum / max(tokens, 1)} if kl_coef else {}),
        "entropy": entropy,
        "forced_token_share": forced / max(tokens, 1),
        **_ratio_figures(run.dp.gather(ratios)),
        "loss": loss,
        "grad_norm": learner.grad_norm,
    }


def bound_figures(bounds: Bounds, positive: float, negative: float) -> dict[str, Any]:
    """The clip bounds an update used and ρ (Eq. 8) under them; with BAPO, how its search
    ended and in how many raises. An on-policy BAPO update searched nothing, so its bounds
    are left out of the step's curve (they could not have acted)."""
    rho = positive / (positive + negative) if positive + negative else 1.0
    search = bounds.search
    if search is None:
        return {"clip_low": bounds.low, "clip_high": bounds.high, "positive_share": rho}
    figures = {
        "positive_share": search.rho,
        "bapo_search": search.outcome,
        "bapo_search_steps": search.steps,
        "bounds_moved": float(search.steps > 0),  # the step's mean: the share of its updates
    }
    if search.outcome == "on-policy":
        return figures
    return {"clip_low": bounds.low, "clip_high": bounds.high, **figures}


def update_sums(
    micro: TokenBatch,
    ratio: torch.Tensor,
    logp: torch.Tensor,
    entropy: torch.Tensor,
    bounds: Bounds,
    kl_ref: torch.Tensor,
) -> torch.Tensor:
    """A micro-batch's share of an update's figures, as sums that add up over micro-batches
    and ranks: ``[Σw·H, P, N, held at c_low, held at c_high, agent tokens, Σ KL(behaviour ‖
    current), Σw, Σ KL(current ‖ reference), forced tokens]``. Both KLs are k3 estimates
    (``r - 1 - log r`` per token: never negative, unlike the mean log-ratio, k1). The
    entropy is over free tokens only (``w`` there): a token the constrained decoder forced
    has entropy 0 whatever the model, and counting it would read as a collapse."""
    mask = micro.loss_mask
    forced = ((micro.allowed >= 0).sum(-1) == 1) & mask.bool()
    free_weight = micro.token_weight * ~forced
    return torch.cat(
        [
            (entropy * free_weight).sum()[None],
            balance(ratio, micro.advantages, mask, bounds.low, bounds.high),
            clip_fractions(ratio, micro.advantages, mask, bounds.low, bounds.high),
            (kl_k3(micro.old_logp, logp) * mask).sum()[None],
            free_weight.sum()[None],
            (kl_ref * mask).sum()[None],
            forced.sum()[None],
        ]
    )


def _ratio_figures(ratios: list[torch.Tensor]) -> dict[str, float]:
    """The importance ratio π_θ/π_behaviour over the update's agent tokens: quantiles and max."""
    values = torch.cat(ratios) if ratios else torch.ones(1)
    values = values if values.numel() else torch.ones(1)
    quantiles = torch.quantile(values, torch.tensor([0.05, 0.5, 0.95]))
    return {
        "ratio_p05": round(float(quantiles[0]), 4),
        "ratio_p50": round(float(quantiles[1]), 4),
        "ratio_p95": round(float(quantiles[2]), 4),
        "ratio_max": round(float(values.max()), 4),
    }
