"""The trainer's recipes and registry through their public surfaces: every ``--algo`` runs
an RL step from the CLI, presets carry their papers' defaults and differ where the papers
say, the minibatch loss is an exact token mean, the KL reference is the policy at the start
of RL, bad settings are refused before anything loads, and every tensor reaches the model
on the model's device. A tiny random Llama with SmolLM2's tokenizer keeps it cheap."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.policies.hf import HFPolicy
from agentgym.trainers.algorithms import SEARCH_OUTCOMES, clipped_surrogate
from agentgym.trainers.batch import collate
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from agentgym.trainers.presets import PRESETS
from agentgym.trainers.update import carrying_gradient
from conftest import run_metrics

TINY = {
    "bc_steps": 0,
    "bc_episodes": 8,
    "steps": 1,
    "tasks_per_step": 2,
    "group_size": 2,
    "minibatch_size": 4,
    "micro_batch_size": 2,
    "max_new_tokens": 4,
    "agent_format": "plain",
    # Unconstrained: the untrained model's replies then never name an option, so every
    # reward is 0 (what the DAPO refill and AgentEvol checks below rely on).
    "constrain_actions": False,
    "eval_every": 0,
    "eval_tasks": 2,
    "agentevol.iterations": 1,
    "critique_rl.stage1_steps": 1,
    "critique_rl.stage2_steps": 0,
    "critique_rl.critiques_per_answer": 2,
}


def train(out: Path, algo: str, model: Path, **settings: object) -> tuple[int, str]:
    args = ["train", "--algo", algo, "--schedule", "fixed", "--model", str(model), "--out", str(out)]
    args += [f"--set={key}={value}" for key, value in (TINY | settings).items()]
    result = CliRunner().invoke(app, args)
    return result.exit_code, result.output


@pytest.mark.parametrize("algo", list(PRESETS))
def test_every_registered_algorithm_runs_an_rl_step_with_its_papers_defaults(
    algo: str, tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    where = {"env_url": choice_url, "env": "choice"}
    if algo == "critique-rl":  # a local math server, started by the trainer
        where = {"env": "math", "env_settings": "{n_train: 8, n_test: 2}"}
    code, output = train(tmp_path, algo, tiny_model_dir, **where)
    assert code == 0, output
    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())
    history = run_metrics(tmp_path)
    assert history[-1]["phase"] != "bc" and len(history) == 1
    expected = {  # (c_high, dynamic sampling, aggregation, dual clip, KL) per the papers
        "grpo": (0.2, False, "seq-mean", 0.0, 0.04),
        "dapo": (0.28, True, "token-mean", 0.0, 0.0),
        "dr-grpo": (0.2, False, "seq-sum-norm", 0.0, 0.0),
        "bapo": (0.2, False, "token-mean", 3.0, 0.0),
        "critique-rl": (0.2, False, "token-mean", 0.0, 0.01),
    }.get(algo, (0.2, False, "token-mean", 0.0, 0.0))
    actual = (
        saved["clip"]["eps_high"],
        saved["dynamic_sampling"],
        saved["loss_aggregation"],
        saved["dual_clip"],
        saved["kl_coef"],
    )
    assert actual == expected
    for update in history[0]["updates"] if PRESETS[algo].regime == "rl" else []:
        if algo == "bapo":
            assert update["bapo_search"] in SEARCH_OUTCOMES
            if update["bapo_search"] != "on-policy":
                assert 1.2 <= update["clip_high"] <= 3.0 and 0.6 <= update["clip_low"] <= 0.9
        else:
            assert update["clip_high"] == pytest.approx(1 + expected[0])
    if algo == "agentevol":  # zero-reward explored episodes are left out, not averaged in as zeros
        expert = (tmp_path / "expert.jsonl").read_text().splitlines()
        assert history[0]["success_rate"] == 0 and history[0]["learn_episodes"] == len(expert)
    if algo == "dapo":  # the random model earns equal (zero) rewards: dropped groups get refilled
        assert history[0]["episodes"] > TINY["tasks_per_step"] * TINY["group_size"]
    elif PRESETS[algo].regime == "rl":
        assert history[0]["episodes"] == TINY["tasks_per_step"] * TINY["group_size"]


def test_the_logged_cloning_loss_does_not_depend_on_micro_batching(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Synthetic critiques differ in length: a token mean over the minibatch is the same
    whether it is computed in one micro-batch or four (a mean of per-micro-batch means is not)."""
    losses = []
    for micro in (1, 4):
        # A large learning rate: a random model's per-token losses are all ~ln(vocab), so the
        # weighting shows in the second step's loss, after an update the weighting steered.
        settings = {
            "env": "math",
            "env_settings": "{n_train: 8, n_test: 2}",
            "bc_steps": 3,
            "learning_rate": 0.05,
        }
        settings |= {
            "bc_batch_size": 4,
            "critique_rl.stage1_steps": 0,
            "micro_batch_size": micro,
            "minibatch_size": 4,
        }
        code, output = train(tmp_path / str(micro), "critique-rl", tiny_model_dir, **settings)
        assert code == 0, output
        losses.append([r["loss"] for r in run_metrics(tmp_path / str(micro))])
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)


def test_the_kl_reference_is_the_policy_after_behaviour_cloning(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    code, output = train(
        tmp_path, "grpo", tiny_model_dir, env_url=choice_url, env="choice", bc_steps=2, kl_coef=0.1
    )
    assert code == 0, output
    assert (tmp_path / "reference.pt").exists()  # main took the base model (adapters off) instead
    reference = torch.load(tmp_path / "reference.pt", weights_only=True)
    after_bc = torch.load(tmp_path / "checkpoints/step-000002/trainable.pt", weights_only=True)
    assert all(torch.equal(r, t) for r, t in zip(reference, after_bc.values(), strict=True))
    lora_b = [r for r, name in zip(reference, after_bc, strict=True) if "lora_B" in name]
    assert any(t.abs().sum() > 0 for t in lora_b)  # not the base model (LoRA B starts at zero)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("bapo.high_step=0", "must be positive"),
        ("bapo.low_step=-0.02", "must be positive"),
        ("bapo.low_start=0.95", "low_start <= low_max"),
        ("rounds=[4, 2, 6]", "rounds must increase"),
        ("schedule=linear", "schedule must be one of fixed, scaling-inter"),
        ("loss_aggregation=sum", "loss_aggregation must be one of"),
        ("clip_rule=wide", "clip_rule must be one of"),
        ("action_order=random", "action_order must be one of hashed, listed"),
    ],
)
def test_bad_settings_are_refused_before_anything_loads(setting: str, message: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["train", "--set", setting, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_presets_fill_only_what_the_user_left_open() -> None:
    assert TrainConfig(algo="dapo", clip={"eps_high": 0.3}).clip.eps_high == 0.3
    switched = TrainConfig(algo="dapo").with_overrides({"algo": "grpo"})
    assert (switched.clip.eps_high, switched.dynamic_sampling) == (0.2, False)
    composed = TrainConfig(algo="rloo", clip_rule="bapo")  # BAPO's clipping on RLOO's advantages
    assert (composed.advantage, composed.clip_rule) == ("rloo", "bapo")


def learner_for(model_dir: Path, **settings: object) -> Learner:
    config = TrainConfig(model=str(model_dir), micro_batch_size=2, learning_rate=0.0, **settings)
    torch.manual_seed(0)
    return Learner(config, HFPolicy(str(model_dir)), DataParallel())


def uneven_minibatch() -> tuple[list[dict], torch.Tensor]:
    """The issue's example: 4 episodes of 2 agent tokens, 4 of 20, each with a 3-token prompt."""
    records = []
    for agent in (2, 2, 2, 2, 20, 20, 20, 20):
        ids = list(range(5, 8 + agent))
        records.append({"token_ids": ids, "loss_mask": [0] * 3 + [1] * agent, "logprobs": []})
    return records, torch.tensor([1.0] * 4 + [0.0] * 4)


def test_the_minibatch_loss_is_the_token_mean_over_all_micro_batches(tiny_model_dir: Path) -> None:
    records, per_episode = uneven_minibatch()
    learner = learner_for(tiny_model_dir)
    batch = collate(records, per_episode.tolist(), pad_id=0).weighted("token-mean")

    def constant_loss(micro):  # loss 1 on the short episodes' tokens, 0 on the long ones'
        logp = learner.logprobs(micro).logp
        return micro.advantages + 0 * logp

    # Micro-batches of 2 (sorted by length): a mean of micro-batch means would be 0.5.
    assert learner.optimize(batch, constant_loss) == pytest.approx(8 / 88)


def test_gradients_of_micro_batches_equal_one_batch(tiny_model_dir: Path) -> None:
    records, _ = uneven_minibatch()
    grads = []
    for micro_batch_size in (1, 8):
        learner = learner_for(tiny_model_dir, lora=False)
        learner.config.micro_batch_size = micro_batch_size
        batch = collate(records, [1.0] * 8, pad_id=0).weighted("token-mean")
        learner.optimize(batch, lambda micro, learner=learner: -learner.logprobs(micro)[0])
        grads.append(torch.cat([p.grad.flatten() for p in learner.trainable]))
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_every_forward_gets_its_tensors_on_the_models_device(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forward pre-hook on every model the learner builds checks each tensor input against
    the model's device: BAPO's pre-pass, the update and the KL reference all go through it."""
    seen: list[str] = []
    original = Learner.__init__

    def checked(self: Learner, *args: object) -> None:
        original(self, *args)

        def hook(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
            device = next(module.parameters()).device
            for value in [*args, *kwargs.values()]:
                if isinstance(value, torch.Tensor):
                    assert value.device == device, f"{value.device} input on a {device} model"
                    seen.append(str(value.device))

        self.model.register_forward_pre_hook(hook, with_kwargs=True)

    monkeypatch.setattr(Learner, "__init__", checked)
    code, output = train(tmp_path, "bapo", tiny_model_dir, env_url=choice_url, env="choice", kl_coef=0.1)
    assert code == 0, output
    assert seen


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (bench/gpu figures: the GPU issue)"
)
def test_a_bapo_update_runs_with_the_model_on_cuda(tiny_model_dir: Path) -> None:
    records, per_episode = uneven_minibatch()
    config = TrainConfig(model=str(tiny_model_dir), micro_batch_size=2)
    learner = Learner(config, HFPolicy(str(tiny_model_dir), device="cuda"), DataParallel())
    batch = collate(records, (per_episode - 0.5).tolist(), pad_id=0).weighted("token-mean")
    prepass = learner.prepass(batch)
    assert prepass.logp.device.type == "cuda" and prepass.old_logp.device.type == "cuda"
    loss = learner.optimize(batch, lambda micro: -learner.logprobs(micro)[0] * micro.advantages)
    assert math.isfinite(loss)


def test_train_help_names_every_registered_algorithm() -> None:
    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    assert all(name in result.output for name in PRESETS)
    assert "no value network, no GAE" in result.output and "REINFORCE++-baseline" in result.output


def test_leaving_out_zero_advantage_episodes_keeps_the_gradient_exact(tiny_model_dir: Path) -> None:
    """Episodes whose advantage is 0 everywhere add nothing to a clipped surrogate's gradient:
    the update leaves them out of forward and backward, and gets the same gradient."""
    records, _ = uneven_minibatch()
    grads, rows = [], []
    for prune in (False, True):
        learner = learner_for(tiny_model_dir, lora=False)
        batch = collate(records, [1.0, 0.0, -1.0, 0.0, 0.5, 0.0, 0.0, -0.5], pad_id=0).weighted("token-mean")
        if prune:
            batch, left_out = carrying_gradient(batch)
            assert left_out == 4
        rows.append(len(batch))

        def surrogate(micro, learner=learner):
            logp = learner.logprobs(micro)[0]
            return clipped_surrogate(logp, logp.detach() - 0.1, micro.advantages, clip_low=0.8, clip_high=1.2)

        learner.optimize(batch, surrogate)
        grads.append(torch.cat([p.grad.flatten() for p in learner.trainable]))
    assert rows == [8, 4]
    assert grads[0].abs().sum() > 0 and torch.allclose(grads[0], grads[1], atol=1e-7)


def test_packed_episodes_give_the_log_probs_loss_and_gradient_of_padded_ones(tiny_model_dir: Path) -> None:
    """Episodes end to end in one row, positions restarting per episode, attention kept
    within each: the same per-token log-probs, minibatch loss and gradient as right-padded
    micro-batches (float32 on CPU, within 1e-5)."""
    records, _ = uneven_minibatch()
    multi_turn = {"token_ids": list(range(30, 52)), "loss_mask": [0] * 4 + [1] * 5 + [0] * 6 + [1] * 7}
    records = [*records, {**multi_turn, "logprobs": []}]
    advantages = [1.0, 0.0, -1.0, 0.5, 0.5, -0.25, 0.0, -0.5, 1.0]
    figures = []
    for pack_tokens in (None, 50):
        learner = learner_for(tiny_model_dir, lora=False, pack_tokens=pack_tokens)
        batch = collate(records, advantages, pad_id=0).weighted("token-mean")

        def surrogate(micro, learner=learner):
            logp = learner.logprobs(micro)[0]
            return clipped_surrogate(logp, logp.detach() - 0.1, micro.advantages, clip_low=0.8, clip_high=1.2)

        rows = len(learner.micro_batches(batch))
        loss = learner.optimize(batch, surrogate)
        figures.append((rows, loss, torch.cat([p.grad.flatten() for p in learner.trainable])))
    (padded_rows, loss, grads), (packed_rows, packed_loss, packed_grads) = figures
    assert (padded_rows, packed_rows) == (5, 3)  # pairs of episodes | 23+23, 23+23, 22+5+5+5+5
    assert packed_loss == pytest.approx(loss, rel=1e-5)
    assert grads.abs().sum() > 0 and torch.allclose(packed_grads, grads, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # and token by token: one row of all nine against nine padded rows
        logp = learner.logprobs(batch)[0]
        packed = learner.logprobs(batch.packed())[0][0]
    lengths = batch.attention_mask.sum(-1).long()
    assert torch.allclose(packed, torch.cat([logp[i, :n] for i, n in enumerate(lengths)]), atol=1e-5)


def test_an_on_policy_minibatch_skips_the_prepass_forward_with_the_same_bounds(tiny_model_dir: Path) -> None:
    records, _ = uneven_minibatch()
    learner = learner_for(tiny_model_dir)
    batch = collate(records, [1.0, -1.0] * 4, pad_id=0)
    with torch.no_grad():  # behaviour log-probs = what the current weights give
        batch.old_logp = learner.logprobs(batch)[0] * batch.loss_mask
    batch = batch.weighted("token-mean")
    forwards = []
    learner.model.register_forward_pre_hook(lambda *_: forwards.append(1))
    full, skipped = learner.prepass(batch), learner.prepass(batch, on_policy=True)
    assert len(forwards) == len(learner.micro_batches(batch))  # only the first ran the model
    assert torch.allclose(full.logp, skipped.logp, atol=1e-5)


def test_the_rl_phase_starts_with_a_fresh_optimizer_unless_told_to_carry_cloning_s(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    """AdamW's state after the first RL step counts RL's updates only (``fresh``, the
    default); ``carried`` keeps counting cloning's too, as every run did before."""
    counted = {}
    for rl_optimizer in ("fresh", "carried"):
        run = tmp_path / rl_optimizer
        code, output = train(run, "grpo", tiny_model_dir, env="choice", env_url=choice_url, bc_steps=2,
                             bc_batch_size=2, kl_coef=0.0, rl_optimizer=rl_optimizer)  # fmt: skip
        assert code == 0, output
        saved = torch.load(run / "checkpoints" / "step-000003" / "optimizer.pt", weights_only=True)
        counted[rl_optimizer] = int(next(iter(saved["optimizer"]["state"].values()))["step"])
        rl = [r for r in run_metrics(run) if r["phase"] == "rl"]
        updates = len(rl[0]["updates"])
    assert counted == {"fresh": updates, "carried": updates + 2}  # two cloning steps before
    code, output = train(tmp_path / "bad", "grpo", tiny_model_dir, env="choice", env_url=choice_url,
                         rl_optimizer="stale")  # fmt: skip
    assert code == 2 and "rl_optimizer must be 'fresh' or 'carried'" in output
