"""RL algorithms as small pure functions on tensors, each registered where it is defined;
nothing here touches a model.

**The registry.** Every ``--algo`` name is a :class:`~agentgym.trainers.presets.Preset`
(``presets.py``) naming an advantage estimator (how episodes become advantages:
:data:`ADVANTAGE_ESTIMATORS`) and a clip rule (the ratio bounds of the clipped loss:
:data:`CLIP_RULES`), which are independent config fields (``advantage``, ``clip_rule``), so
BAPO's clipping composes with any estimator. The trainer looks them up and never branches on
a name. Adding an algorithm: one function here with its decorator (:func:`outcome_estimator`
for a function of the outcome scores, :func:`advantage_estimator` for one of whole episodes,
:func:`clip_rule`), a test pinning it to hand-computed values, and its preset.

Shapes: ``rewards``/``group_ids`` are ``[B]`` (one scalar outcome per episode, episodes of
the same task share a group id); token tensors are ``[B, T]`` with ``mask`` 1 on agent
tokens (the trajectory's ``loss_mask``).

**Aggregation is a weight per token, fixed on the whole minibatch** (:func:`token_weights`):
every loss is ``Σ_t w_t · loss_t``. A micro-batch or a data-parallel rank sums its rows'
share, so summing over micro-batches and ranks gives exactly the loss of the whole
minibatch in one piece: token-mean really is the mean over every agent token of the
minibatch (DAPO), not an average of micro-batch means.

Each policy loss is the PPO clipped surrogate with *ratio bounds* ``[c_low, c_high]``:

    L = -min(r·A, clip(r, c_low, c_high)·A),  r = exp(logp - logp_old)

and, for A < 0, dual-clip caps the loss at ``dual_clip·|A|`` (Ye et al. 2020; BAPO's code
uses 3). PPO uses ``[1-ε, 1+ε]``, DAPO's clip-higher ``[1-ε_low, 1+ε_high]``, and BAPO
searches the bounds at every update (:func:`bapo_bounds`). See docs/algorithms/.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from agentgym.trainers.loss_settings import AGGREGATIONS, BapoConfig
from agentgym.trainers.registry import registering_in

if TYPE_CHECKING:
    from agentgym.records.trajectory import Trajectory

# ----- the registry: each algorithm registers where it is defined ---------------------

Advantage = float | list[float]
"""An episode's advantage: one number for every agent token, or one per agent turn."""
AdvantageEstimator = Callable[[Sequence["Trajectory"], Tensor], list[Advantage]]
"""``f(episodes, group_ids [B]) -> one Advantage per episode``: whole episodes go in (per-turn
rewards and observations), so per-turn estimators such as GiGPO fit the same slot."""
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {}
"""The ``advantage`` names (:func:`advantage_estimator`, :func:`outcome_estimator`)."""


advantage_estimator = registering_in(ADVANTAGE_ESTIMATORS)
"""``@advantage_estimator(name)``: an estimator of whole episodes as ``advantage: name``."""


def outcome_estimator(name: str, *, grouped: bool = True, **fixed: Any) -> Callable[[Callable], Callable]:
    """Register ``f(rewards [B], group_ids [B], **fixed) -> advantages [B]``, a function of
    the episodes' outcome scores, as ``advantage: name`` (``grouped=False``: ``f(rewards)``,
    whitened over the batch). Stacked, one function gives several names."""

    def register(advantages: Callable[..., Tensor]) -> Callable[..., Tensor]:
        def estimate(episodes: Sequence[Trajectory], group_ids: Tensor) -> list[Advantage]:
            rewards = torch.tensor([float(e.score) for e in episodes])
            groups = (group_ids,) if grouped else ()
            return advantages(rewards, *groups, **fixed).tolist()

        ADVANTAGE_ESTIMATORS[name] = estimate
        return advantages

    return register


@dataclass(frozen=True)
class Prepass:
    """What a clip rule may look at before an update: this rank's share of the minibatch
    under the current weights (no gradient), and how to sum figures over ranks."""

    logp: Tensor
    old_logp: Tensor
    advantages: Tensor
    mask: Tensor
    reduce: Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class Bounds:
    low: float
    high: float
    search: BapoSearch | None = None
    """BAPO: how its search over the whole minibatch (all ranks) ended, and the ρ reached."""


ClipRule = Callable[[Any, Callable[[], Prepass]], Bounds]
"""``rule(config, prepass) -> Bounds``; ``prepass()`` costs a forward, so only call it if needed."""
CLIP_RULES: dict[str, ClipRule] = {}
"""The ``clip_rule`` names (:func:`clip_rule`)."""


clip_rule = registering_in(CLIP_RULES)
"""``@clip_rule(name)``: a clip rule as ``clip_rule: name``."""


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


@outcome_estimator("grpo-unscaled", normalize_std=False)  # Dr. GRPO
@outcome_estimator("grpo")
def grpo_advantages(
    rewards: Tensor, group_ids: Tensor, *, normalize_std: bool = True, eps: float = 1e-6
) -> Tensor:
    """GRPO: ``(R - mean_group) / (std_group + eps)``; ``normalize_std=False`` is Dr. GRPO."""
    mean, std, _ = _group_stats(rewards, group_ids)
    centred = rewards - mean
    return centred / (std + eps) if normalize_std else centred


@outcome_estimator("rloo")
def rloo_advantages(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """RLOO: ``R_i - mean_{j≠i} R_j`` = ``n/(n-1)·(R_i - mean_group)`` (0 for singleton groups)."""
    mean, _, count = _group_stats(rewards, group_ids)
    return torch.where(
        count > 1, (rewards - mean) * count / (count - 1).clamp(min=1), torch.zeros_like(rewards)
    )


@outcome_estimator("batch-whitened", grouped=False)
@outcome_estimator("reinforce++-baseline")
def reinforce_pp_advantages(rewards: Tensor, group_ids: Tensor | None = None, *, eps: float = 1e-6) -> Tensor:
    """REINFORCE++: whiten across the whole batch; with ``group_ids``, subtract the group
    mean first (REINFORCE++-baseline)."""
    centred = rewards - _group_stats(rewards, group_ids)[0] if group_ids is not None else rewards
    return (centred - centred.mean()) / (centred.std(unbiased=False) + eps)


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """``G_t = r_t + γ·G_{t+1}`` for each turn of an episode."""
    returns, running = [], 0.0
    for reward in reversed(rewards):
        running = reward + gamma * running
        returns.append(running)
    return returns[::-1]


def step_advantages(
    returns: list[list[float]], anchors: list[list[str]], group_ids: list[int], *, eps: float = 1e-6
) -> list[list[float]]:
    """GiGPO's step-level advantage (arXiv 2505.10978): the turns of one task's group that
    saw the same environment state (``anchors``, e.g. the observation text) form a step
    group; each turn's discounted return is normalised inside it, ``(G - mean) / (std + eps)``
    with the sample std (0 for a turn whose state no other turn of the group saw)."""
    keys = [(g, anchor) for g, episode in zip(group_ids, anchors, strict=True) for anchor in episode]
    values = torch.tensor([value for episode in returns for value in episode], dtype=torch.float)
    if not keys:
        return [[] for _ in returns]
    ids = torch.tensor([sorted(set(keys)).index(key) for key in keys])
    mean, std, count = _group_stats(values, ids)
    flat = torch.where(count > 1, (values - mean) / (std + eps), torch.zeros_like(values)).tolist()
    out, start = [], 0
    for episode in returns:
        out.append(flat[start : start + len(episode)])
        start += len(episode)
    return out


def observations_before_replies(episode: Trajectory) -> list[str]:
    """The observation the agent answered at each of its turns: GiGPO's anchor states."""
    messages = episode.messages
    return [
        messages[i - 1]["content"] if i > 0 else ""
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and m.get("loss", True)
    ]


@advantage_estimator("gigpo")
def gigpo(
    episodes: Sequence[Trajectory], group_ids: Tensor, *, omega: float = 1.0, gamma: float = 0.95
) -> list[Advantage]:
    """GiGPO: GRPO's episode advantage plus ``omega`` × the step advantage of each turn
    (:func:`~agentgym.trainers.algorithms.step_advantages`, returns discounted by ``gamma``);
    the paper's ω = 1, γ = 0.95. An episode whose turns cannot be matched to its tokens keeps
    the episode advantage alone."""
    episode_level = grpo_advantages(torch.tensor([float(e.score) for e in episodes]), group_ids).tolist()
    anchors = [observations_before_replies(e) for e in episodes]
    returns = [discounted_returns(list(e.rewards), gamma) for e in episodes]
    usable = [
        len(a) == len(r) == agent_turns(e.loss_mask or [])
        for e, a, r in zip(episodes, anchors, returns, strict=True)
    ]
    steps = step_advantages(
        [r if ok else [] for r, ok in zip(returns, usable, strict=True)],
        [a if ok else [] for a, ok in zip(anchors, usable, strict=True)],
        group_ids.tolist(),
    )
    return [
        [base + omega * step for step in turn] if ok else base
        for base, turn, ok in zip(episode_level, steps, usable, strict=True)
    ]


def agent_turns(loss_mask: Sequence[int]) -> int:
    """Runs of consecutive agent tokens: one per agent turn."""
    return sum(turn_starts(loss_mask, i) for i in range(len(loss_mask)))


def turn_starts(loss_mask: Sequence[int], i: int) -> bool:
    """Whether an agent turn starts at token ``i``."""
    return bool(loss_mask[i]) and (i == 0 or not loss_mask[i - 1])


def shuffled_advantages(
    advantages: Sequence[float | Sequence[float]], rng: random.Random
) -> list[float | list[float]]:
    """The placebo's advantages (``TrainConfig.shuffle_advantages``): every value of the
    batch (one per episode, or one per agent turn) handed to a random slot of the same
    batch, each episode keeping its shape. The update keeps its size, its share of zero
    advantages and its value distribution; what the reward says of each episode is gone."""
    pool = [v for a in advantages for v in (a if isinstance(a, Sequence) else [a])]
    rng.shuffle(pool)
    values = iter(pool)
    return [[next(values) for _ in a] if isinstance(a, Sequence) else next(values) for a in advantages]


def dynamic_sampling_keep(rewards: Tensor, group_ids: Tensor) -> Tensor:
    """DAPO's dynamic sampling: a ``[B]`` bool mask dropping groups whose rewards are all
    equal (they carry no GRPO signal)."""
    _, std, count = _group_stats(rewards, group_ids)
    return (std > 0) & (count > 1)


# ----- aggregation, KL, entropy --------------------------------------------------------


def token_weights(mask: Tensor, mode: str = "token-mean", *, norm_tokens: int | None = None) -> Tensor:
    """``[B, T]`` weights that turn per-token losses into the minibatch loss ``Σ w·loss``.

    ``token-mean``: ``1/N`` on each of the minibatch's N agent tokens (DAPO, BAPO).
    ``seq-mean``: each episode weighs the same (``1/(n·len_i)``, GRPO's original form).
    ``seq-sum-norm``: Dr. GRPO, each episode's token *sum* over a constant ``norm_tokens``
    (no length normalisation), averaged over episodes.
    """
    mask = mask.float()
    lengths = mask.sum(-1, keepdim=True)
    episodes = max(int((lengths > 0).sum()), 1)
    if mode == "token-mean":
        return mask / mask.sum().clamp(min=1)
    if mode == "seq-mean":
        return mask / lengths.clamp(min=1) / episodes
    if mode == "seq-sum-norm":
        if not norm_tokens:
            raise ValueError("seq-sum-norm needs norm_tokens, the constant per-episode token budget")
        return mask / (norm_tokens * episodes)
    raise ValueError(f"unknown aggregation {mode!r}; use one of {', '.join(AGGREGATIONS)}")


def aggregate(loss: Tensor, mask: Tensor, mode: str = "token-mean", **options: int) -> Tensor:
    """``loss`` aggregated over the agent tokens of one whole batch (see :func:`token_weights`)."""
    return (loss * token_weights(mask, mode, **options).to(loss.dtype)).sum()


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


def importance_ratio(logp: Tensor, old_logp: Tensor) -> Tensor:
    return torch.exp((logp - old_logp).clamp(-20, 20))


def clipped_surrogate(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float = 0.0,
) -> Tensor:
    """Per-token ``-min(r·A, clip(r, clip_low, clip_high)·A)``; with ``dual_clip`` c > 1,
    tokens with A < 0 lose at most ``c·|A|`` (a huge ratio on a bad token cannot blow up
    the update). ``advantages`` are ``[B, T]`` (or ``[B]``, broadcast over tokens)."""
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    ratio = importance_ratio(logp, old_logp)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(clip_low, clip_high) * advantages)
    if dual_clip > 1:
        loss = torch.where(advantages < 0, torch.minimum(loss, -dual_clip * advantages), loss)
    return loss


def clip_fractions(ratio: Tensor, advantages: Tensor, mask: Tensor, c_low: float, c_high: float) -> Tensor:
    """``[tokens with A<0 held at c_low, tokens with A>0 held at c_high, agent tokens]``
    as counts, so shares can be summed over micro-batches and ranks before dividing."""
    agent = mask.bool()
    return torch.stack(
        [
            ((ratio < c_low) & (advantages < 0) & agent).sum(),
            ((ratio > c_high) & (advantages > 0) & agent).sum(),
            agent.sum(),
        ]
    ).float()


def balance(ratio: Tensor, advantages: Tensor, mask: Tensor, c_low: float, c_high: float) -> Tensor:
    """``[P, N]`` of :func:`positive_share`, as sums (so parts add up over micro-batches)."""
    agent = mask.bool()
    value = torch.minimum(ratio * advantages, ratio.clamp(c_low, c_high) * advantages)
    zero = torch.zeros_like(value)
    positive = value.where(agent & (advantages > 0), zero).sum()
    negative = (-value).where(agent & (advantages < 0), zero).sum()
    return torch.stack([positive, negative])


def positive_share(
    ratio: Tensor,
    advantages: Tensor,
    mask: Tensor,
    c_low: float,
    c_high: float,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> Tensor:
    """BAPO's Eq. 8: ρ = P/(P+N), each agent token at its clipped value
    ``v = min(r·A, clip(r, c_low, c_high)·A)``: ``P = Σ v`` over A>0, ``N = Σ |v|`` over
    A<0. A clipped token counts at its clipped value, not 0 (it carries no gradient, but
    it is still part of the objective). Read literally the paper's denominator is a signed
    sum; P + N (both as magnitudes) is the reading that keeps ρ a share in [0, 1].

    Only c_high moves ρ up: admitting a positive token with r > c_high raises P. Raising
    c_low only raises N (a negative token held at c_low counts ``c_low·|A|``).
    ``reduce`` sums ``[P, N]`` over data-parallel ranks, so each rank's share of a
    minibatch gives the ρ of the whole minibatch.
    """
    sums = balance(ratio, advantages, mask, c_low, c_high)
    positive, negative = reduce(sums) if reduce is not None else sums
    total = positive + negative
    return positive / total if total > 0 else torch.ones((), dtype=ratio.dtype)


# ----- BAPO ------------------------------------------------------------------------------

RATIO_NOISE = 1e-3
"""Ratios within this of 1 count as 1: the weights that sampled the tokens score them."""


BAPO_PAPER = BapoConfig()
"""BAPO's search with the paper's settings (frozen: a safe default argument)."""

SEARCH_OUTCOMES = ("reached", "saturated", "on-policy")
"""How a BAPO search ended: ρ0 reached; both bounds at their ceilings short of ρ0; or not
run, because every ratio is 1 (no bound can change the loss)."""


@dataclass(frozen=True)
class BapoSearch:
    """The bounds one BAPO search chose, the ρ they give, and how it got there."""

    low: float
    high: float
    rho: float
    steps: int
    """Bound raises taken (c_high's and c_low's together)."""
    outcome: str
    """One of :data:`SEARCH_OUTCOMES`."""


def _raised(start: float, step: float, times: int, ceiling: float) -> float:
    # From the start each time, not by repeated addition: 1.2 + 3·0.05 is 1.35, not 1.3500000000000003.
    return min(round(start + times * step, 10), ceiling)


def bapo_bounds(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    config: BapoConfig = BAPO_PAPER,
    reduce: Callable[[Tensor], Tensor] | None = None,
) -> BapoSearch:
    """BAPO's Algorithm 1 for one update: from ``(a⁻, a⁺)``, while ρ < ρ0 raise c_high by
    δ1 until b⁺, then c_low by δ2 until b⁻. Stops at the first bounds that reach ρ0
    (``reached``) or at ``(b⁻, b⁺)`` short of it (``saturated``). Under Eq. 8 raising
    c_low cannot raise ρ (:func:`positive_share`), so a search that exhausts c_high ends
    saturated; the order is the paper's, kept as written. When every agent token's ratio is
    1 (the minibatch was sampled by the current weights) no bound can change the loss, so
    no search runs: the start bounds, ``on-policy``.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None].expand_as(logp)
    total = reduce if reduce is not None else (lambda sums: sums)
    with torch.no_grad():
        ratio = importance_ratio(logp, old_logp)

        def share(raises_high: int, raises_low: int) -> float:
            c_low = _raised(config.low_start, config.low_step, raises_low, config.low_max)
            c_high = _raised(config.high_start, config.high_step, raises_high, config.high_max)
            return float(positive_share(ratio, advantages, mask, c_low, c_high, reduce))

        off_policy = ((ratio - 1).abs() > RATIO_NOISE) & mask.bool()
        high, low, rho = 0, 0, share(0, 0)
        if float(total(off_policy.sum().float()[None])[0]) == 0:
            return BapoSearch(config.low_start, config.high_start, rho, 0, "on-policy")
        outcome = "reached"
        while rho < config.rho0:
            if _raised(config.high_start, config.high_step, high, config.high_max) < config.high_max:
                high += 1
            elif _raised(config.low_start, config.low_step, low, config.low_max) < config.low_max:
                low += 1
            else:
                outcome = "saturated"
                break
            rho = share(high, low)
    return BapoSearch(
        _raised(config.low_start, config.low_step, low, config.low_max),
        _raised(config.high_start, config.high_step, high, config.high_max),
        rho,
        high + low,
        outcome,
    )


@clip_rule("fixed")
def fixed_bounds(config: Any, prepass: Callable[[], Prepass]) -> Bounds:
    """PPO ``[1-ε, 1+ε]``; DAPO's clip-higher when ``eps_high > eps_low``."""
    return Bounds(1 - config.clip.eps_low, 1 + config.clip.eps_high)


@clip_rule("bapo")
def bapo_search(config: Any, prepass: Callable[[], Prepass]) -> Bounds:
    """BAPO: bounds searched on the whole minibatch under the current weights."""
    data = prepass()
    search = bapo_bounds(data.logp, data.old_logp, data.advantages, data.mask, config.bapo, data.reduce)
    return Bounds(search.low, search.high, search)


# ----- AgentEvol ----------------------------------------------------------------------


def agentevol_weights(rewards: Tensor, threshold: float | None = None) -> Tensor:
    """AgentEvol's per-episode weights: the reward itself (the paper's reward-weighted
    objective, rewards in [0, 1]); with ``threshold``, 1 for episodes whose reward reaches it
    and 0 otherwise (filtered behaviour cloning, what the released code does)."""
    if threshold is None:
        return rewards.clamp(min=0)
    return (rewards >= threshold).to(rewards.dtype)


def weighted_nll(logp: Tensor, weights: Tensor) -> Tensor:
    """Per-token ``-w·log π(a_t)``: behaviour cloning when every ``w = 1``, AgentEvol's learn
    step with :func:`agentevol_weights` (``weights`` ``[B, T]`` or ``[B]``)."""
    if weights.dim() == 1:
        weights = weights[:, None]
    return -logp * weights
