"""Constrained decoding is action masking: the policy that acted is the policy trained.

A reply constrained to a few commands is drawn from the model's distribution renormalised
over the tokens that keep it on one of them. Its recorded behaviour log-probs are those of
that distribution (checked by hand from the model's logits), and the learner, given the
turn's choices from the trajectory, scores the same tokens under the same mask.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from agentgym.policies.base import GenerationRequest, SamplingParams
from agentgym.policies.hf import HFPolicy
from agentgym.trainers.batch import TokenBatch, allowed_at_positions, collate
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from agentgym.trainers.update import carrying_gradient, clipped_update, update_policy

COMMANDS = ["go north", "go east", "take the rusty key", "open door"]


def by_hand(model: torch.nn.Module, prompt: list[int], reply: list[int], choices: list[list[int]]):
    """Per reply token: (log-prob over the allowed next tokens, over the whole vocabulary)."""
    masked, free, live = [], [], choices
    for j, token in enumerate(reply):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + reply[:j]])).logits[0, -1].float()
        allowed = sorted({c[j] for c in live})
        masked.append(float(logits[token] - torch.logsumexp(logits[allowed], dim=0)))
        free.append(float(torch.log_softmax(logits, dim=0)[token]))
        live = [c for c in live if c[j] == token]
    return masked, free


def test_behaviour_and_learner_log_probs_are_those_of_the_masked_distribution(tiny_model_dir: Path) -> None:
    torch.manual_seed(0)
    policy = HFPolicy(str(tiny_model_dir))
    learner = Learner(TrainConfig(model=str(tiny_model_dir), temperature=1.0), policy, DataParallel())
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "You are in a hall."}]
    request = GenerationRequest(messages, policy.prompt_ids(messages), info={"reply_choices": COMMANDS})
    sampling = SamplingParams(temperature=1.0, max_new_tokens=16, seed=5)
    (reply,) = asyncio.run(policy.generate([request], sampling))
    assert reply.choices and reply.token_ids in reply.choices  # one of the allowed replies, whole
    prompt = request.prompt_ids
    masked, free = by_hand(policy.model, prompt, reply.token_ids, reply.choices)
    assert reply.logprobs == pytest.approx(masked, abs=1e-4)
    # The first token's allowed set leaves out most of the vocabulary's mass.
    assert reply.logprobs[0] > free[0] + 0.1

    record = {
        "token_ids": prompt + reply.token_ids,
        "loss_mask": [0] * len(prompt) + [1] * len(reply.token_ids),
        "logprobs": [0.0] * len(prompt) + reply.logprobs,
        "reply_choices": [reply.choices],
    }
    batch = collate([record], [1.0], pad_id=0)
    with torch.no_grad():
        logp, entropy = learner.logprobs(batch, with_entropy=True)[:2]
    agent = batch.loss_mask[0].bool()
    assert logp[0][agent].tolist() == pytest.approx(reply.logprobs, abs=1e-4)  # ratio 1 at the same weights
    assert torch.exp(logp[0][agent] - batch.old_logp[0][agent]).tolist() == pytest.approx(
        [1.0] * int(agent.sum()), abs=1e-3
    )
    # Entropy of the masked distribution: at most log(allowed ids), 0 where one id is left.
    sizes = [
        len(ids)
        for _, ids in sorted(
            allowed_at_positions(record["token_ids"], record["loss_mask"], [reply.choices]).items()
        )
    ]
    for h, size in zip(entropy[0][agent].tolist(), sizes, strict=True):
        assert -1e-5 <= h <= torch.log(torch.tensor(float(size))).item() + 1e-5

    free_record = {**record, "reply_choices": None}  # scored without the mask: the model's own
    with torch.no_grad():
        unmasked = learner.logprobs(collate([free_record], [1.0], pad_id=0)).logp
    assert unmasked[0][agent].tolist() == pytest.approx(free, abs=1e-4)


def test_allowed_tokens_follow_the_reply_through_its_choices() -> None:
    # Turn 1 (positions 2-4) chose [7, 8, 2] among [7, 8, 2], [7, 9, 2], [6, 2]; turn 2 was free.
    allowed = allowed_at_positions(
        [1, 1, 7, 8, 2, 1, 5, 2], [0, 0, 1, 1, 1, 0, 1, 1], [[[7, 8, 2], [7, 9, 2], [6, 2]], []]
    )
    assert allowed == {2: [6, 7], 3: [8, 9], 4: [2]}
    with pytest.raises(ValueError, match="agent turns"):
        allowed_at_positions([1, 7, 2], [0, 1, 1], [[], []])


def forced_end_batch(learner: Learner, advantages: tuple[float, ...] = (1.0, -1.0, 1.0, -1.0)) -> TokenBatch:
    """Episodes whose constrained reply ends on a forced token (the end id 2, the only one
    allowed once a command is complete), behaviour log-probs from the current weights."""
    choices = [[7, 8, 2], [7, 9, 2], [6, 2]]
    records = [
        {
            "token_ids": [1, 1, *reply],
            "loss_mask": [0, 0] + [1] * len(reply),
            "logprobs": [],
            "reply_choices": [choices],
        }
        for reply in ([7, 8, 2], [6, 2], [7, 9, 2], [6, 2])
    ]
    batch = collate(records, list(advantages), pad_id=0)
    with torch.no_grad():
        batch.old_logp = learner.logprobs(batch)[0] * batch.loss_mask
    return batch


@pytest.mark.parametrize("coef", [0.0, 1.0])
def test_rl_keeps_the_forced_end_token_likely_without_the_mask_only_with_its_term(
    tiny_model_dir: Path, coef: float
) -> None:
    """The end of a complete command is forced: its masked log-prob is 0 whatever the weights,
    so the clipped surrogate never trains it. The forced-token term trains it under the
    model's own distribution (what generation outside the constrained decoder samples)."""
    torch.manual_seed(0)
    config = TrainConfig(model=str(tiny_model_dir), temperature=1.0, learning_rate=1e-2, forced_end_coef=coef)
    learner = Learner(config, HFPolicy(str(tiny_model_dir)), DataParallel())
    batch = forced_end_batch(learner)
    end = (batch.input_ids == 2) & batch.loss_mask.bool()

    def free_end_logp() -> float:
        with torch.no_grad():
            return float(learner.logprobs(batch)[2][end].mean())

    before = free_end_logp()
    train_on(config, learner, batch, 5)
    with torch.no_grad():
        masked = learner.logprobs(batch)[0][end]
    assert masked.abs().max() < 1e-6  # forced: probability 1 under the mask, before and after
    gain = free_end_logp() - before
    print(f"\nforced_end_coef {coef}: free log-prob of the forced end {before:.3f} -> {before + gain:.3f}")
    assert gain > 0.5 if coef else abs(gain) < 0.1


def update_context(config: TrainConfig, learner: Learner) -> SimpleNamespace:
    """What ``clipped_update`` reads of a trainer."""
    return SimpleNamespace(config=config, learner=learner, dp=DataParallel(), version=0)


def train_on(config: TrainConfig, learner: Learner, batch: TokenBatch, updates: int) -> None:
    """``updates`` clipped updates on the whole of ``batch``, token-mean."""
    run = update_context(config, learner)
    for _ in range(updates):
        clipped_update(run, batch.weighted("token-mean"), kl_coef=0.0)


def test_zero_advantage_episodes_carry_no_forced_end_term_so_leaving_them_out_is_exact(
    tiny_model_dir: Path,
) -> None:
    """One rule for zero-advantage episodes under every algorithm: they carry the KL and
    entropy terms only. The forced-end term rides on the episodes with an advantage, so the
    update that leaves the others out (no KL, no entropy) trains the very same loss."""
    config = TrainConfig(model=str(tiny_model_dir), temperature=1.0, forced_end_coef=1.0)
    figures = []
    for prune in (False, True):
        torch.manual_seed(0)
        learner = Learner(config, HFPolicy(str(tiny_model_dir)), DataParallel())
        minibatch = forced_end_batch(learner, (1.0, 0.0, -1.0, 0.0)).weighted("token-mean")
        if prune:
            minibatch, left_out = carrying_gradient(minibatch)
            assert left_out == 2
        loss = clipped_update(update_context(config, learner), minibatch, kl_coef=0.0)["loss"]
        figures.append((loss, torch.cat([p.grad.flatten() for p in learner.trainable])))
    (loss, grads), (pruned_loss, pruned_grads) = figures
    assert grads.abs().sum() > 0
    assert pruned_loss == pytest.approx(loss, abs=1e-6)
    assert torch.allclose(grads, pruned_grads, atol=1e-7)


def test_entropy_is_reported_over_free_tokens_with_the_share_of_forced_ones(tiny_model_dir: Path) -> None:
    """A forced token has entropy 0 under the mask whatever the model: averaged in, it read as
    a collapse. The figure (and the collapse guard reading it) covers the free tokens."""
    torch.manual_seed(0)
    config = TrainConfig(model=str(tiny_model_dir), temperature=1.0)
    learner = Learner(config, HFPolicy(str(tiny_model_dir)), DataParallel())
    minibatch = forced_end_batch(learner).weighted("token-mean")
    agent = minibatch.loss_mask.bool()
    forced = ((minibatch.allowed >= 0).sum(-1) == 1) & agent
    with torch.no_grad():
        entropy = learner.logprobs(minibatch, with_entropy=True)[1]
    free = agent & ~forced
    figures = clipped_update(update_context(config, learner), minibatch, kl_coef=0.0)
    assert int(forced.sum()) == 4 and int(agent.sum()) == 10  # each reply's end token
    assert figures["forced_token_share"] == pytest.approx(0.4)
    assert figures["entropy"] == pytest.approx(float(entropy[free].mean()), rel=1e-4)
    assert figures["entropy"] > float(entropy[agent].mean()) * 1.5  # what it read before


def test_an_update_without_any_advantage_reports_no_entropy(tiny_model_dir: Path) -> None:
    """When every group agreed, the update runs one stand-in row (the optimizer still steps);
    its entropy is not the policy's, so the step reports none and the collapse guard stays
    quiet, where it read a near-0 figure as a collapse."""
    torch.manual_seed(0)
    config = TrainConfig(model=str(tiny_model_dir), temperature=1.0, minibatch_size=4, ppo_epochs=1)
    learner = Learner(config, HFPolicy(str(tiny_model_dir)), DataParallel())
    trainer = update_context(config, learner)
    trainer.minibatch = lambda b: b.weighted("token-mean")
    figures = update_policy(trainer, forced_end_batch(learner, (0.0, 0.0, 0.0, 0.0)), kl_coef=0.0)
    assert figures["skipped_episodes"] == 3 and "entropy" not in figures
    assert [u["advantage_rows"] for u in figures["updates"]] == [0]
    assert "entropy" in update_policy(trainer, forced_end_batch(learner), kl_coef=0.0)
    # With an entropy term every row runs, so the reading is the policy's and stays.
    trainer.config = replace(config, entropy_coef=1e-4)
    figures = update_policy(trainer, forced_end_batch(learner, (0.0, 0.0, 0.0, 0.0)), kl_coef=0.0)
    assert figures["skipped_episodes"] == 0 and figures["entropy"] > 0


def test_command_mass_is_the_free_probability_of_the_allowed_ids_where_the_decoder_chose(
    tiny_model_dir: Path,
) -> None:
    """At a constrained token other than a forced end, ``command_logmass`` is log Σ softmax
    over the ids allowed there, by hand from the model's logits; 0 at a forced end (its own
    term) and on free tokens; absent unless asked for."""
    learner = Learner(TrainConfig(model=str(tiny_model_dir)), HFPolicy(str(tiny_model_dir)), DataParallel())
    batch = forced_end_batch(learner)
    with torch.no_grad():
        assert learner.logprobs(batch).command_logmass is None
        mass = learner.logprobs(batch, with_command_mass=True).command_logmass
        logits = learner.model(input_ids=batch.input_ids).logits.float()
    allowed = {2: [6, 7], 3: [8, 9]}  # [7, 8, 2] and [7, 9, 2]: the second token; 2 is forced
    for row, ids in enumerate(batch.input_ids.tolist()):
        expected = [0.0] * len(ids)
        for position in range(2, len(ids)):
            if (held := allowed.get(position)) and not (position == 3 and ids[2] == 6):
                expected[position] = float(
                    torch.log_softmax(logits[row, position - 1], -1)[held].logsumexp(0)
                )
        assert mass[row].tolist() == pytest.approx(expected, abs=1e-4)


def free_mass_gain(model_dir: Path, coef: float, updates: int = 10) -> float:
    """How much ``updates`` clipped updates of the forced-end batch raise the mean free
    log-mass of the allowed ids where two or more were allowed, at ``command_mass_coef``."""
    torch.manual_seed(0)
    config = TrainConfig(
        model=str(model_dir), temperature=1.0, learning_rate=1e-2, forced_end_coef=0.0, command_mass_coef=coef
    )
    learner = Learner(config, HFPolicy(str(model_dir)), DataParallel())
    batch = forced_end_batch(learner)
    held = batch.allowed[..., 1] >= 0

    def free_mass() -> float:
        with torch.no_grad():
            return float(learner.logprobs(batch, with_command_mass=True).command_logmass[held].mean())

    before = free_mass()
    train_on(config, learner, batch, updates)
    print(f"\ncommand_mass_coef {coef}: free log-mass of the allowed ids {before:.3f} -> {free_mass():.3f}")
    return free_mass() - before


def test_rl_keeps_free_generation_on_the_commands_only_with_the_command_mass_term(
    tiny_model_dir: Path,
) -> None:
    """The surrogate is over the distribution renormalised on the allowed ids, so it hardly
    moves the mass outside them (the tiny model's allowed ids start near e^-10 of it); the
    command-mass term raises it."""
    without, with_term = free_mass_gain(tiny_model_dir, 0.0), free_mass_gain(tiny_model_dir, 1.0)
    assert abs(without) < 0.2
    assert with_term > without + 0.25
