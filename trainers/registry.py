"""The algorithm registry: advantage estimators and clip rules, by name. Every ``--algo``
name is a :class:`~agentgym.trainers.presets.Preset` (``presets.py``) that picks one of each.

A preset names an advantage estimator (how episodes become advantages), a clip rule (the
ratio bounds of the clipped policy loss), the recipe that trains with them, and the config
defaults its paper uses. The trainer looks things up here and never branches on a name.

Adding an algorithm: one function (an estimator below, a clip rule, or a recipe in
``regimes.py``) plus one entry here, and its preset in ``presets.py``. Estimator and clip rule are independent config fields
(``advantage``, ``clip_rule``), so BAPO's clipping composes with any estimator.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor

from agentgym.trainers.algorithms import (
    BapoSearch,
    bapo_bounds,
    discounted_returns,
    grpo_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    step_advantages,
)
from agentgym.trainers.batch import agent_turns
from agentgym.trajectory import Trajectory

Advantage = float | list[float]
"""An episode's advantage: one number for every agent token, or one per agent turn."""
AdvantageEstimator = Callable[[Sequence[Trajectory], Tensor], list[Advantage]]
"""``f(episodes, group_ids [B]) -> one Advantage per episode``: whole episodes go in (per-turn
rewards and observations), so per-turn estimators such as GiGPO fit the same slot."""


def outcome(advantages: Callable[[Tensor, Tensor], Tensor]) -> AdvantageEstimator:
    """An estimator from a function of the episodes' outcome scores and group ids."""

    def estimate(episodes: Sequence[Trajectory], group_ids: Tensor) -> list[Advantage]:
        rewards = torch.tensor([float(e.score) for e in episodes])
        return advantages(rewards, group_ids).tolist()

    return estimate


def observations_before_replies(episode: Trajectory) -> list[str]:
    """The observation the agent answered at each of its turns: GiGPO's anchor states."""
    messages = episode.messages
    return [
        messages[i - 1]["content"] if i > 0 else ""
        for i, m in enumerate(messages)
        if m["role"] == "assistant" and m.get("loss", True)
    ]


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


ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": outcome(grpo_advantages),
    "grpo-unscaled": outcome(partial(grpo_advantages, normalize_std=False)),  # Dr. GRPO
    "rloo": outcome(rloo_advantages),
    "reinforce++-baseline": outcome(reinforce_pp_advantages),
    "batch-whitened": outcome(lambda rewards, _: reinforce_pp_advantages(rewards)),
    "gigpo": gigpo,
}


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


def fixed_bounds(config: Any, prepass: Callable[[], Prepass]) -> Bounds:
    """PPO ``[1-ε, 1+ε]``; DAPO's clip-higher when ``eps_high > eps_low``."""
    return Bounds(1 - config.clip.eps_low, 1 + config.clip.eps_high)


def bapo_search(config: Any, prepass: Callable[[], Prepass]) -> Bounds:
    """BAPO: bounds searched on the whole minibatch under the current weights."""
    data = prepass()
    search = bapo_bounds(data.logp, data.old_logp, data.advantages, data.mask, config.bapo, data.reduce)
    return Bounds(search.low, search.high, search)


CLIP_RULES: dict[str, ClipRule] = {"fixed": fixed_bounds, "bapo": bapo_search}
