"""RL algorithms as small pure functions on tensors; nothing here touches a model.

Shapes: ``rewards``/``group_ids`` are ``[B]`` (one scalar outcome per episode, episodes of
the same task share a group id); token tensors are ``[B, T]`` with ``mask`` 1 on agent
tokens (the trajectory's ``loss_mask``). Advantages are per episode and broadcast to its
tokens by the loss.

Each policy loss is the PPO clipped surrogate with *ratio bounds* ``[c_low, c_high]``:

    L = -min(r·A, clip(r, c_low, c_high)·A),  r = exp(logp - logp_old)

PPO uses ``[1-ε, 1+ε]``, DAPO's clip-higher ``[1-ε_low, 1+ε_high]``, and BAPO searches the
bounds at every update (:func:`bapo_bounds`). See docs/algorithms/ for the formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

# ----- advantages ------------------------------------------------------------------


def _group_stats(values: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per-episode group mean, sample std (Bessel) and group size, each ``[B]``."""
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1
    count = torch.zeros(groups, dtype=values.dtype).scatter_add_(0, inverse, torch.ones_like(values))
    total = torch.zeros(groups, dtype=values.dtype).scatter_add_(0, inverse, values)
    mean = total / count
    squares = torch.zeros(groups, dtype=values.dtype).scatter_add_(0, inverse, (values - mean[inverse]) ** 2)
    std = torch.sqrt(squares / (count - 1).clamp(min=1))
    return mean[inverse], std[inverse], count[inverse]


def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: ``(R - mean_group) / (std_group + eps)``; ``normalize_std=False`` is Dr. GRPO."""
    mean, std, _ = _group_stats(rewards, group_ids)
    centred = rewards - mean
    return centred / (std + eps) if normalize_std else centred


def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: ``R_i - mean_{j≠i} R_j`` = ``n/(n-1)·(R_i - mean_group)`` (0 for singleton groups)."""
    mean, _, count = _group_stats(rewards, group_ids)
    return torch.where(
        count > 1, (rewards - mean) * count / (count - 1).clamp(min=1), torch.zeros_like(rewards)
    )


def reinforce_pp_advantages(rewards: Tensor, group_ids: Tensor | None = None, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: whiten across the whole batch; with ``group_ids``, subtract the group
    mean first (REINFORCE++-baseline)."""
    centred = rewards - _group_stats(rewards, group_ids)[0] if group_ids is not None else rewards
    return (centred - centred.mean()) / (centred.std(unbiased=False) + eps)


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO's dynamic sampling: a ``[B]`` bool mask dropping groups whose rewards are all
    equal (they carry no GRPO signal)."""
    _, std, count = _group_stats(rewards, group_ids)
    return (std > 0) & (count > 1)


# ----- aggregation, KL, entropy --------------------------------------------------------


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean") -> Tensor:
    """``token-mean``: every agent token weighs the same; ``seq-mean``: every episode
    weighs the same (mean over episodes of its token mean)."""
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum().clamp(min=1)
    if mode == "seq-mean":
        per_sequence = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sequence[mask.sum(-1) > 0].mean()
    raise ValueError(f"unknown aggregation {mode!r}; use 'token-mean' or 'seq-mean'")


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token k3 estimator of KL(π || π_ref): ``exp(Δ) - Δ - 1`` with ``Δ = ref - logp``
    (unbiased, always ≥ 0)."""
    delta = ref_logp - logp
    return torch.exp(delta) - delta - 1


def entropy_from_logits(logits: Tensor) -> Tensor:
    """Per-token entropy of the softmax distribution, ``[..., V] -> [...]``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(-1)


# ----- the clipped surrogate -----------------------------------------------------------


@dataclass(frozen=True)
class LossStats:
    clip_low: float
    clip_high: float
    clip_frac_low: float
    """Share of agent tokens with A<0 whose ratio was clipped at ``c_low`` (no gradient)."""
    clip_frac_high: float
    """Share of agent tokens with A>0 whose ratio was clipped at ``c_high`` (no gradient)."""
    positive_share: float
    """ρ = P/(P+N): the positive-advantage share of the clipped objective."""
    approx_kl: float
    """Mean ``logp_old - logp`` over agent tokens."""


def positive_share(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    c_low: float,
    c_high: float,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """ρ = P/(P+N) over the tokens that carry gradient: ``P = Σ r·A`` over A>0 with
    ``r ≤ c_high``, ``N = Σ r·|A|`` over A<0 with ``r ≥ c_low``. Clipped tokens (A>0 above
    c_high, A<0 below c_low) get no gradient, so they count for neither side; that is why
    raising c_high (admitting positives) and raising c_low (dropping negatives) both raise ρ.
    ``reduce`` sums ``[P, N]`` over data-parallel ranks, so each rank's share of a minibatch
    gives the ρ of the whole minibatch.
    """
    active = torch.where(advantages >= 0, ratio <= c_high, ratio >= c_low) & mask.bool()
    contribution = (ratio * advantages).where(active, torch.zeros_like(ratio))
    sums = torch.stack([contribution.clamp(min=0).sum(), (-contribution).clamp(min=0).sum()])
    positive, negative = reduce(sums) if reduce is not None else sums
    total = positive + negative
    return positive / total if total > 0 else torch.ones((), dtype=ratio.dtype)


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    aggregation: str = "token-mean",
) -> tuple[Tensor, LossStats]:
    """``-min(r·A, clip(r, clip_low, clip_high)·A)`` aggregated over agent tokens.
    ``advantages`` may be ``[B]`` (broadcast over tokens) or ``[B, T]``."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = torch.exp((logp - old_logp).clamp(-20, 20))
    unclipped, clipped = ratio * advantages, ratio.clamp(clip_low, clip_high) * advantages
    loss = aggregate(-torch.minimum(unclipped, clipped), mask, aggregation)
    with torch.no_grad():
        agent = mask.bool()
        held = clipped < unclipped  # the bound is active: this token gets no gradient
        stats = LossStats(
            clip_low=clip_low,
            clip_high=clip_high,
            clip_frac_low=_share(held & (advantages < 0), agent),
            clip_frac_high=_share(held & (advantages > 0), agent),
            positive_share=float(positive_share(ratio, advantages, mask, clip_low, clip_high)),
            approx_kl=float(((old_logp - logp) * mask).sum() / mask.sum().clamp(min=1)),
        )
    return loss, stats


def _share(flags: Tensor, among: Tensor) -> float:
    return float((flags & among).sum() / among.sum().clamp(min=1))


# ----- BAPO ------------------------------------------------------------------------------


@dataclass(frozen=True)
class BapoConfig:
    """BAPO's bound search (arXiv 2510.18927); defaults are the paper's."""

    rho0: float = 0.4
    """Target positive share ρ0 of the clipped objective, ρ = P/(P+N)."""
    low_start: float = 0.6
    """a⁻: c_low's start."""
    low_max: float = 0.9
    """b⁻: c_low's ceiling."""
    high_start: float = 1.2
    """a⁺: c_high's start."""
    high_max: float = 3.0
    """b⁺: c_high's ceiling."""
    high_step: float = 0.05
    """δ1: c_high's step."""
    low_step: float = 0.02
    """δ2: c_low's step."""


def bapo_bounds(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: BapoConfig = BapoConfig(),
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> tuple[float, float, float]:
    """Search ``(c_low, c_high)`` for one update; returns them and the reached ρ.

    From ``(a⁻, a⁺)``: while ρ < ρ0, raise c_high by δ1 (admitting more positive tokens
    whose ratio grew) until b⁺, then c_low by δ2 (clipping more negative tokens whose ratio
    fell) until b⁻. Stops at the first bounds that reach ρ0, or when both are exhausted.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    with torch.no_grad():
        ratio = torch.exp((logp - old_logp).clamp(-20, 20))
        c_low, c_high = config.low_start, config.high_start
        rho = float(positive_share(ratio, advantages, mask, c_low, c_high, reduce))
        while rho < config.rho0:
            if c_high < config.high_max - 1e-9:
                c_high = min(c_high + config.high_step, config.high_max)
            elif c_low < config.low_max - 1e-9:
                c_low = min(c_low + config.low_step, config.low_max)
            else:
                break
            rho = float(positive_share(ratio, advantages, mask, c_low, c_high, reduce))
    return c_low, c_high, rho


# ----- named policy losses ---------------------------------------------------------


@dataclass(frozen=True)
class ClipConfig:
    eps_low: float = 0.2
    """PPO/DAPO: c_low = 1 - eps_low."""
    eps_high: float = 0.2
    """PPO: 0.2; DAPO's clip-higher: 0.28."""


def policy_loss(
    name: str,
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip: ClipConfig = ClipConfig(),
    bapo: BapoConfig = BapoConfig(),
    aggregation: str = "token-mean",
) -> tuple[Tensor, LossStats]:
    """``ppo`` (symmetric clip), ``clip-higher`` (DAPO) or ``bapo`` (searched bounds)."""
    if name == "bapo":
        c_low, c_high, _ = bapo_bounds(logp, old_logp, advantages, mask, bapo)
    elif name in ("ppo", "clip-higher"):
        c_low, c_high = 1 - clip.eps_low, 1 + clip.eps_high
    else:
        raise ValueError(f"unknown policy loss {name!r}; use 'ppo', 'clip-higher' or 'bapo'")
    return clipped_surrogate(
        logp, old_logp, advantages, mask, clip_low=c_low, clip_high=c_high, aggregation=aggregation
    )


# ----- AgentEvol ----------------------------------------------------------------------


def agentevol_weights(rewards: Tensor, threshold: float | None = None) -> Tensor:
    """AgentEvol's per-episode weights: the reward itself (the paper's reward-weighted
    objective, rewards in [0, 1]); with ``threshold``, 1 for episodes whose reward reaches it
    and 0 otherwise (filtered behaviour cloning, what the released code does)."""
    if threshold is None:
        return rewards.clamp(min=0)
    return (rewards >= threshold).to(rewards.dtype)


def weighted_nll(logp: Tensor, mask: Tensor, weights: Tensor, aggregation: str = "token-mean") -> Tensor:
    """``-Σ_i w_i Σ_t log π(a_t)`` over agent tokens: behaviour cloning when every ``w_i = 1``,
    AgentEvol's learn step with :func:`agentevol_weights`."""
    return aggregate(-logp * weights[:, None], mask, aggregation)
