"""Every advantage and loss pinned to values computed by hand (shown in the comments)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from agentgym.records.trajectory import Trajectory
from agentgym.trainers.algorithms import (
    ADVANTAGE_ESTIMATORS,
    BapoConfig,
    agentevol_weights,
    aggregate,
    bapo_bounds,
    clip_fractions,
    clipped_surrogate,
    discounted_returns,
    dynamic_sampling_keep,
    entropy_from_logits,
    grpo_advantages,
    importance_ratio,
    kl_k3,
    positive_share,
    reinforce_pp_advantages,
    rloo_advantages,
    shuffled_advantages,
    token_weights,
    weighted_nll,
)
from agentgym.trainers.batch import collate, token_record
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.schedules import FixedHorizon, ScalingInterHorizon

T = torch.tensor
REWARDS = T([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
GROUPS = T([0, 0, 0, 0, 1, 1])


def test_grpo_advantages_by_hand() -> None:
    # group 0: mean 0.5, sample std sqrt(4*0.25/3) = 0.57735 -> ±0.5/0.57735 = ±0.86603
    # group 1: all equal -> 0 / (0 + eps) = 0
    adv = grpo_advantages(REWARDS, GROUPS)
    assert torch.allclose(adv, T([0.86603, -0.86603, -0.86603, 0.86603, 0.0, 0.0]), atol=1e-4)
    assert torch.allclose(
        grpo_advantages(REWARDS, GROUPS, normalize_std=False), T([0.5, -0.5, -0.5, 0.5, 0, 0])
    )


def test_rloo_advantages_by_hand() -> None:
    # R_0 = 1, others in group 0: (0+0+1)/3 -> 1 - 1/3 = 0.6667; R_1 = 0 -> 0 - 2/3 = -0.6667
    adv = rloo_advantages(REWARDS, GROUPS)
    assert torch.allclose(adv, T([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0, 0.0]), atol=1e-6)
    assert rloo_advantages(T([3.0]), T([7])).item() == 0.0  # singleton group: no baseline, no signal


def test_reinforce_pp_advantages_by_hand() -> None:
    # rewards [1, 0, 0, 1, 1, 1]: mean 2/3, population std sqrt(2/9) = 0.4714
    adv = reinforce_pp_advantages(REWARDS)
    assert torch.allclose(adv, T([0.7071, -1.4142, -1.4142, 0.7071, 0.7071, 0.7071]), atol=1e-4)
    # baseline variant: group-centred [0.5,-0.5,-0.5,0.5,0,0]; mean 0, population std sqrt(1/6)
    adv = reinforce_pp_advantages(REWARDS, GROUPS)
    scale = math.sqrt(6)
    assert torch.allclose(adv, T([0.5, -0.5, -0.5, 0.5, 0, 0]) * scale, atol=1e-4)


def test_dynamic_sampling_drops_groups_with_equal_rewards() -> None:
    assert dynamic_sampling_keep(REWARDS, GROUPS).tolist() == [True, True, True, True, False, False]


def test_the_placebo_hands_the_same_advantages_to_random_slots() -> None:
    """Every value kept, each episode's shape kept (one number, or one per turn), the order
    a seeded shuffle's: the placebo arm's update has the size and spread of the real one."""
    advantages = [1.5, -0.5, [0.25, -1.0, 2.0], 0.0, [3.0], -2.0, 0.75, -0.25]
    shuffled = shuffled_advantages(advantages, random.Random(0))
    flat = [v for a in shuffled for v in (a if isinstance(a, list) else [a])]
    assert sorted(flat) == sorted([-1.0, 2.0, 3.0, 0.25, *[a for a in advantages if isinstance(a, float)]])
    assert [len(a) if isinstance(a, list) else None for a in shuffled] == [
        None,
        None,
        3,
        None,
        1,
        None,
        None,
        None,
    ]
    assert shuffled != advantages
    assert shuffled == shuffled_advantages(advantages, random.Random(0))


def test_the_placebo_is_refused_where_there_are_no_advantages_to_shuffle() -> None:
    with pytest.raises(ValueError, match=r"shuffle_advantages .* not agentevol"):
        TrainConfig(algo="agentevol", shuffle_advantages=True)
    assert TrainConfig(algo="bapo", shuffle_advantages=True).shuffle_advantages


def test_aggregation_modes_by_hand() -> None:
    loss = T([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
    mask = T([[1, 1, 1], [1, 0, 0]])
    assert aggregate(loss, mask, "token-mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)
    assert aggregate(loss, mask, "seq-mean").item() == pytest.approx((2.0 + 4.0) / 2)
    # Dr. GRPO: token sums over a constant budget (10), averaged over episodes: (6/10 + 4/10) / 2
    assert aggregate(loss, mask, "seq-sum-norm", norm_tokens=10).item() == pytest.approx(0.5)
    with pytest.raises(ValueError, match="unknown aggregation"):
        aggregate(loss, mask, "sum")


def test_token_mean_weights_of_parts_sum_to_the_whole_minibatch() -> None:
    # The example: 4 episodes of 2 tokens with loss 1, 4 of 20 tokens with loss 0.
    # True token mean 8/88 = 0.0909; a mean of two micro-batch means (sorted by length) is 0.5.
    mask = torch.zeros(8, 20)
    mask[:4, :2] = 1
    mask[4:] = 1
    loss = torch.zeros(8, 20)
    loss[:4, :2] = 1
    weights = token_weights(mask, "token-mean")
    parts = [(loss[rows] * weights[rows]).sum() for rows in (slice(0, 4), slice(4, 8))]
    assert sum(parts).item() == pytest.approx(8 / 88)


def test_k3_kl_and_entropy_by_hand() -> None:
    # delta = ref - logp = log(0.5): exp(delta) - delta - 1 = 0.5 + 0.693147 - 1 = 0.193147
    assert kl_k3(T([0.0]), T([math.log(0.5)])).item() == pytest.approx(0.193147, abs=1e-6)
    assert kl_k3(T([-1.0]), T([-1.0])).item() == 0.0
    # uniform over 4 -> ln 4
    assert entropy_from_logits(torch.zeros(1, 4)).item() == pytest.approx(math.log(4), abs=1e-6)


def ratios_to_logps(ratios: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """logp/old_logp pairs with exactly these ratios (old logp fixed at log 0.5)."""
    old = torch.full((1, len(ratios)), math.log(0.5))
    return old + torch.log(T([ratios])), old


def test_ppo_clip_loss_by_hand() -> None:
    # ratios [0.5, 1.0, 1.5], A = +1 on every token:
    # min(r, clip(r, 0.8, 1.2)) = [0.5, 1.0, 1.2] -> loss = -(0.5 + 1.0 + 1.2)/3 = -0.9
    logp, old = ratios_to_logps([0.5, 1.0, 1.5])
    mask = torch.ones(1, 3)
    loss = clipped_surrogate(logp, old, T([1.0]), clip_low=0.8, clip_high=1.2)
    assert aggregate(loss, mask).item() == pytest.approx(-0.9, abs=1e-6)
    ratio = importance_ratio(logp, old)
    assert clip_fractions(ratio, T([[1.0] * 3]), mask, 0.8, 1.2).tolist() == [0, 1, 3]
    # A = -1: -min(-r, -clip(r)) = max(r, clip(r)) = [0.8, 1.0, 1.5] -> mean 1.1
    loss = clipped_surrogate(logp, old, T([-1.0]), clip_low=0.8, clip_high=1.2)
    assert aggregate(loss, mask).item() == pytest.approx(1.1, abs=1e-6)
    assert clip_fractions(ratio, T([[-1.0] * 3]), mask, 0.8, 1.2).tolist() == [1, 0, 3]


def test_clip_higher_loss_by_hand() -> None:
    # DAPO: bounds [0.8, 1.28]; ratios [0.5, 1.0, 1.5], A=+1 -> [0.5, 1.0, 1.28] -> -0.926667
    logp, old = ratios_to_logps([0.5, 1.0, 1.5])
    loss = clipped_surrogate(logp, old, T([1.0]), clip_low=0.8, clip_high=1.28)
    assert loss.mean().item() == pytest.approx(-(0.5 + 1.0 + 1.28) / 3, abs=1e-6)


def test_dual_clip_caps_the_loss_of_negative_tokens() -> None:
    # A = -1, ratios [1.0, 5.0]: PPO's loss is r·|A| = [1, 5]; dual-clip c=3 caps it at 3.
    logp, old = ratios_to_logps([1.0, 5.0])
    plain = clipped_surrogate(logp, old, T([-1.0]), clip_low=0.8, clip_high=1.2)
    capped = clipped_surrogate(logp, old, T([-1.0]), clip_low=0.8, clip_high=1.2, dual_clip=3.0)
    assert plain.tolist()[0] == pytest.approx([1.0, 5.0]) and capped.tolist()[0] == pytest.approx([1.0, 3.0])
    positive = clipped_surrogate(logp, old, T([1.0]), clip_low=0.8, clip_high=1.2, dual_clip=3.0)
    assert positive.tolist()[0] == pytest.approx([-1.0, -1.2])  # A > 0 untouched


def test_bapo_refuses_steps_that_never_move_and_disordered_bounds() -> None:
    for bad in ({"high_step": 0}, {"low_step": -0.02}, {"low_start": 0.95}, {"high_max": 1.1}, {"rho0": 1.5}):
        with pytest.raises(ValueError, match="bapo"):
            BapoConfig(**bad)


def test_gradient_flows_only_through_unclipped_tokens() -> None:
    logp, old = ratios_to_logps([0.5, 1.0, 1.5])
    logp.requires_grad_(True)
    loss = clipped_surrogate(logp, old, T([1.0]), clip_low=0.8, clip_high=1.2)
    aggregate(loss, torch.ones(1, 3)).backward()
    # d/dlogp of -(r)/3 = -r/3 for unclipped tokens; 0 where clipped (r=1.5 > 1.2)
    assert torch.allclose(logp.grad, T([[-0.5 / 3, -1.0 / 3, 0.0]]), atol=1e-6)


def test_positive_share_counts_clipped_tokens_at_their_clipped_value() -> None:
    # Eq. 8 at [0.6, 1.2], each token at min(r·A, clip(r)·A):
    #   A=+1 r=1.0 -> P 1.0 | A=+1 r=2.0 -> P 1.2 (clipped) | A=-1 r=0.5 -> N 0.6 (held at c_low)
    #   A=-1 r=1.0 -> N 1.0 | A=-2 r=0.8 -> N 1.6          => rho = 2.2 / (2.2 + 3.2)
    ratio = T([[1.0, 2.0, 0.5, 1.0, 0.8]])
    adv = T([[1.0, 1.0, -1.0, -1.0, -2.0]])
    rho = positive_share(ratio, adv, torch.ones(1, 5), 0.6, 1.2)
    assert rho.item() == pytest.approx(2.2 / 5.4, abs=1e-6)
    masked = positive_share(ratio, adv, T([[1, 1, 1, 0, 0]]), 0.6, 1.2)  # only agent tokens count
    assert masked.item() == pytest.approx(2.2 / 2.8, abs=1e-6)


def test_bapo_keeps_bounds_when_the_clipped_positive_share_reaches_target() -> None:
    # (A=+1, r=2.0), (A=-1, r=1.0): at [0.6, 1.2], rho = 1.2 / (1.2 + 1.0) = 0.5454... >= 0.4.
    # Counting the clipped token as 0 would give rho = 0 and push c_high up to 2.0, letting
    # through the very token the trust region exists to hold.
    logp, old = ratios_to_logps([2.0, 1.0])
    search = bapo_bounds(logp, old, T([[1.0, -1.0]]), torch.ones(1, 2))
    assert (search.low, search.high) == (0.6, 1.2)
    assert search.rho == pytest.approx(1.2 / 2.2, abs=1e-6)
    assert (search.steps, search.outcome) == (0, "reached")


def test_bapo_raises_c_high_by_exact_steps_until_rho_reaches_target() -> None:
    # (+1, r 1.5), (-1, r 1.0), (-1, r 1.0): rho = c_high / (c_high + 2) for c_high <= 1.5:
    # 1.2 -> 0.375, 1.25 -> 0.3846, 1.30 -> 0.3939, 1.35 -> 0.4030 >= 0.4: three raises.
    logp, old = ratios_to_logps([1.5, 1.0, 1.0])
    search = bapo_bounds(logp, old, T([[1.0, -1.0, -1.0]]), torch.ones(1, 3))
    assert (search.low, search.high) == (0.6, 1.35)
    assert search.rho == pytest.approx(1.35 / 3.35, abs=1e-6)
    assert (search.steps, search.outcome) == (3, "reached")


def test_bapo_search_saturates_because_raising_c_low_cannot_raise_rho() -> None:
    # (+1, r 1.0), (-1, r 1.0), (-1, r 0.75), b+ = 1.3: no positive token is clipped, so c_high
    # admits nothing (2 raises to 1.3); c_low then climbs 0.6 -> 0.9 (15 raises) and only makes
    # the held negative weigh more (0.75 -> 0.9): rho ends at 1 / (1 + 1 + 0.9), short of 0.5.
    logp, old = ratios_to_logps([1.0, 1.0, 0.75])
    search = bapo_bounds(
        logp, old, T([[1.0, -1.0, -1.0]]), torch.ones(1, 3), BapoConfig(rho0=0.5, high_max=1.3)
    )
    assert (search.low, search.high) == (0.9, 1.3)
    assert search.rho == pytest.approx(1 / 2.9, abs=1e-6)
    assert (search.steps, search.outcome) == (17, "saturated")


def test_bapo_runs_no_search_when_every_ratio_is_one() -> None:
    # Sampled by the current weights: rho = 1 / 3 < 0.4, but no bound can change the loss.
    logp, old = ratios_to_logps([1.0, 1.0, 1.0])
    search = bapo_bounds(logp, old, T([[1.0, -1.0, -1.0]]), torch.ones(1, 3))
    assert (search.low, search.high, search.steps, search.outcome) == (0.6, 1.2, 0, "on-policy")
    assert search.rho == pytest.approx(1 / 3, abs=1e-6)


def test_horizon_schedules() -> None:
    assert [FixedHorizon(7).horizon_at(t) for t in (1, 100, 10_000)] == [7, 7, 7]
    schedule = ScalingInterHorizon(rounds=[10, 20, 30], interval=100)
    assert [schedule.horizon_at(t) for t in (1, 100, 101, 200, 201, 10_000)] == [10, 10, 20, 20, 30, 30]
    assert (FixedHorizon(7).longest, schedule.longest) == (7, 30)
    with pytest.raises(ValueError):
        ScalingInterHorizon(rounds=[], interval=5)
    with pytest.raises(ValueError):
        schedule.horizon_at(0)
    with pytest.raises(ValueError, match="rounds must increase"):
        ScalingInterHorizon(rounds=[10, 5, 30], interval=5)


def test_agentevol_weights_and_weighted_nll_by_hand() -> None:
    rewards = T([1.0, 0.5, 0.0])
    assert agentevol_weights(rewards).tolist() == [1.0, 0.5, 0.0]
    assert agentevol_weights(rewards, threshold=0.5).tolist() == [1.0, 1.0, 0.0]
    logp = T([[0.0, -1.0, -2.0], [0.0, -3.0, 0.0], [0.0, -4.0, -4.0]])
    mask = T([[0, 1, 1], [0, 1, 0], [0, 1, 1]])
    # token-mean: (1*(1+2) + 0.5*3 + 0*(4+4)) / 5 agent tokens = 4.5/5
    assert aggregate(weighted_nll(logp, T([1.0, 0.5, 0.0])), mask).item() == pytest.approx(0.9)


def crafted_episode(observations: list[str], rewards: list[float], score: float) -> Trajectory:
    messages = [{"role": "system", "content": "play", "loss": False}]
    for observation in observations:
        messages += [
            {"role": "user", "content": observation},
            {"role": "assistant", "content": "go", "loss": True},
        ]
    mask = [0, 0] + [1, 0] * len(observations)
    return Trajectory(
        env="t", task_id="t0", policy="p", messages=messages, rewards=rewards, score=score,
        token_ids=list(range(len(mask))), loss_mask=mask, logprobs=[0.0] * len(mask),
    )  # fmt: skip


def test_gigpo_advantages_by_hand() -> None:
    # One task, two episodes that both start in state A; then B (reward 1) or C (nothing).
    # Episode level (GRPO on scores 1, 0): ±0.7071.
    # Returns, γ = 0.95: [0.95, 1.0] and [0.0, 0.0]. Step group A holds 0.95 and 0.0:
    # mean 0.475, sample std 0.6718 -> ±0.7071; B and C are seen once -> 0.
    episodes = [crafted_episode(["A", "B"], [0.0, 1.0], 1.0), crafted_episode(["A", "C"], [0.0, 0.0], 0.0)]
    advantages = ADVANTAGE_ESTIMATORS["gigpo"](episodes, T([0, 0]))
    assert advantages[0] == pytest.approx([1.41421, 0.70711], abs=1e-4)
    assert advantages[1] == pytest.approx([-1.41421, -0.70711], abs=1e-4)
    # GRPO gives every turn the episode advantage alone.
    assert ADVANTAGE_ESTIMATORS["grpo"](episodes, T([0, 0])) == pytest.approx([0.70711, -0.70711], abs=1e-4)
    assert discounted_returns([0.0, 0.0, 1.0], 0.5) == [0.25, 0.5, 1.0]


def test_per_turn_advantages_reach_each_turns_tokens() -> None:
    episode = crafted_episode(["A", "B"], [0.0, 1.0], 1.0)
    batch = collate([token_record(episode)], [[2.0, -1.0]], pad_id=0)
    assert batch.advantages.tolist() == [[0.0, 0.0, 2.0, 0.0, -1.0, 0.0]]
