"""Config, checkpoints, metrics log and batch/log-prob plumbing of the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from agentgym.records.run_folder import MetricsLog, RunDir
from agentgym.trainers.batch import collate, sequence_logprobs
from agentgym.trainers.config import TrainConfig
from conftest import tiny_llama


def test_config_overrides_validation_and_round_trip(tmp_path) -> None:
    config = TrainConfig().with_overrides({"steps": 3, "bapo.rho0": 0.5, "rounds": [1, 2]})
    assert (config.steps, config.bapo.rho0, config.rounds) == (3, 0.5, [1, 2])
    config.save(tmp_path / "config.yaml")
    assert TrainConfig.load(tmp_path / "config.yaml") == config
    with pytest.raises(ValueError, match="unknown config key"):
        config.with_overrides({"bapo.nope": 1})
    with pytest.raises(
        ValueError, match=r"unknown config key stepz \(did you mean bc_steps, steps\?\)\. `agentgym"
    ):
        TrainConfig.from_dict({"stepz": 1})  # the near keys, not all ninety
    with pytest.raises(
        ValueError, match=r"unknown algo 'bapp' \(did you mean bapo\?\); choose one of bapo, grpo"
    ):
        TrainConfig(algo="bapp")
    with pytest.raises(ValueError, match=r"unknown algo 'magic'; choose one of"):
        TrainConfig(algo="magic")
    assert TrainConfig().with_overrides({"learning_rate": "1e-3"}).learning_rate == 1e-3  # YAML 1.1 string
    with pytest.raises(ValueError, match="learning_rate must be a number"):
        TrainConfig(learning_rate="fast")
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        TrainConfig(minibatch_size=6, micro_batch_size=4)


def test_regime_settings_are_sections_checked_by_their_regime_and_flat_keys_still_load(tmp_path) -> None:
    config = TrainConfig(algo="critique-rl", env="math").with_overrides({"critique_rl.stage2_beta": "0.5"})
    assert config.critique_rl.stage2_beta == 0.5  # a YAML 1.1 string inside a section, too
    # A config file or run folder of an earlier version, flat keys included, loads into the sections.
    (tmp_path / "old.yaml").write_text("algo: agentevol\nevol_iterations: 3\nevol_reward_threshold: 1.0\n")
    old = TrainConfig.load(tmp_path / "old.yaml")
    assert (old.agentevol.iterations, old.agentevol.reward_threshold) == (3, 1.0)
    assert old.with_overrides({"evol_iterations": 5}).agentevol.iterations == 5  # --set evol_iterations=5
    assert "evol_iterations" not in old.to_dict() and old.to_dict()["agentevol"]["iterations"] == 3
    # Each regime checks its own section, and only when its preset is the one training.
    with pytest.raises(ValueError, match=r"critique_rl\.critiques_per_answer must be at least 2"):
        config.with_overrides({"critique_rl.critiques_per_answer": 1})
    assert TrainConfig(critique_rl={"critiques_per_answer": 1}).algo == "bapo"
    with pytest.raises(ValueError, match="critique-rl trains on question-and-answer problems"):
        TrainConfig(algo="critique-rl", env="textworld")
    with pytest.raises(ValueError, match=r"agentevol\.iterations must be at least 0"):
        TrainConfig(algo="agentevol", agentevol={"iterations": -1})
    with pytest.raises(ValueError, match=r"unknown config key agentevol\.iteration \(did you mean"):
        TrainConfig.from_dict({"agentevol": {"iteration": 2}})


def test_token_logprobs_align_with_tokens() -> None:
    model = tiny_llama()
    ids = torch.tensor([[3, 7, 11, 5, 2]])
    logp, entropy = sequence_logprobs(model, ids, torch.ones_like(ids), with_entropy=True)[:2]
    logits = model(input_ids=ids).logits[0]
    for t in range(1, 5):  # token t is predicted from position t-1
        expected = torch.log_softmax(logits[t - 1], -1)[ids[0, t]]
        assert logp[0, t].item() == pytest.approx(expected.item(), abs=1e-5)
    assert logp[0, 0] == 0 and entropy[0, 0] == 0
    assert 0 < entropy[0, 1].item() <= math.log(50) + 1e-5
    hot = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=2.0).logp
    expected = torch.log_softmax(logits[0] / 2.0, -1)[ids[0, 1]]
    assert hot[0, 1].item() == pytest.approx(expected.item(), abs=1e-5)


def test_right_padding_does_not_change_logprobs() -> None:
    model = tiny_llama()
    short = {"token_ids": [3, 7, 11], "loss_mask": [0, 1, 1], "logprobs": [0.0, -1.0, -2.0]}
    long = {
        "token_ids": [4, 8, 12, 16, 20],
        "loss_mask": [0, 0, 1, 1, 1],
        "logprobs": [0, 0, -1.0, -2.0, -3.0],
    }
    batch = collate([short, long], [1.0, -1.0], pad_id=0)
    assert batch.input_ids.shape == (2, 5) and batch.attention_mask[0].tolist() == [1, 1, 1, 0, 0]
    assert batch.old_logp[0].tolist() == [0, -1.0, -2.0, 0, 0]
    assert batch.old_logp[1].tolist() == [0, 0, -1.0, -2.0, -3.0]
    padded = sequence_logprobs(model, batch.input_ids, batch.attention_mask).logp
    alone = sequence_logprobs(
        model, torch.tensor([short["token_ids"]]), torch.ones(1, 3, dtype=torch.long)
    ).logp
    assert torch.allclose(padded[0, :3], alone[0], atol=1e-5)
    with pytest.raises(ValueError, match="one entry per token"):
        collate([{**short, "logprobs": [-1.0]}], [1.0], pad_id=0)


def test_checkpoint_round_trip_restores_weights_optimizer_and_rng(tmp_path) -> None:
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    run = RunDir(tmp_path)
    folder = run.save_checkpoint(1, model, optimizer, {"horizon": 4}, {"replay.jsonl": "{}\n"})
    assert run.latest_checkpoint() == folder
    assert (folder / "replay.jsonl").read_text() == "{}\n"
    expected_draw = torch.rand(3)

    restored = tiny_llama(seed=1)
    restored_optimizer = torch.optim.AdamW(restored.parameters(), lr=1e-2)
    state = RunDir.load_checkpoint(folder, restored, restored_optimizer)
    assert state == {"step": 1, "horizon": 4}
    for (_, a), (_, b) in zip(model.named_parameters(), restored.named_parameters(), strict=True):
        assert torch.equal(a, b)
    assert restored_optimizer.state_dict()["state"][0]["step"] == 1
    assert torch.equal(torch.rand(3), expected_draw)  # RNG continues exactly where it was saved


def test_metrics_log_resume_drops_later_steps_and_torn_lines(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path)
    for step in (1, 2, 3):
        log.log({"step": step, "reward": step / 10})
    with open(path, "a") as fh:
        fh.write('{"step": 4, "rew')  # a kill -9 mid-write
    resumed = MetricsLog(path, resume_step=2)
    assert [r["step"] for r in resumed.read()] == [1, 2]
    resumed.log({"step": 3, "reward": 0.3})
    assert [r["step"] for r in resumed.read()] == [1, 2, 3]


def test_metrics_also_go_to_tensorboard(tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from agentgym.trainers.reporting import open_sinks

    log = MetricsLog(tmp_path / "metrics.jsonl", sinks=open_sinks(["tensorboard"], tmp_path, {}, "", None))
    for step in (1, 2):
        log.log({"step": step, "phase": "rl", "success_rate": step / 4, "flag": True})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("success_rate")] == [(1, 0.25), (2, 0.5)]
    assert "flag" not in events.Tags()["scalars"]  # booleans and strings stay in the JSONL only


def test_logprobs_limited_to_positions_match_the_full_computation() -> None:
    model = tiny_llama()
    ids = torch.tensor([[3, 7, 11, 5, 2, 9], [4, 4, 8, 1, 0, 0]])
    attention = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]])
    positions = torch.tensor([[0, 0, 1, 1, 0, 1], [0, 1, 0, 1, 0, 0]])
    full, full_entropy = sequence_logprobs(model, ids, attention, with_entropy=True)[:2]
    part, part_entropy = sequence_logprobs(model, ids, attention, positions=positions, with_entropy=True)[:2]
    assert torch.allclose(part, full * positions, atol=1e-5)
    assert torch.allclose(part_entropy, full_entropy * positions, atol=1e-5)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated")  # peft probes it
def test_merged_lora_weights_reproduce_the_adapted_model() -> None:
    """What a separate generator (vLLM) is sent: plain HF names, adapters merged in."""
    from peft import LoraConfig, get_peft_model

    from agentgym.trainers.generators import merged_weights as _merged_weights

    adapted = get_peft_model(tiny_llama(), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in adapted.named_parameters():
            if "lora_B" in name:  # B starts at zero: make the adapters matter
                param.normal_(0, 0.5)
    ids = torch.tensor([[3, 7, 11, 5, 2]])
    expected = adapted(input_ids=ids).logits
    plain = tiny_llama(seed=1)  # different weights until the merged ones are loaded
    weights = dict(_merged_weights(adapted))
    assert set(weights) == set(plain.state_dict())
    plain.load_state_dict(weights)
    assert torch.allclose(plain(input_ids=ids).logits, expected, atol=1e-5)
    assert torch.allclose(adapted(input_ids=ids).logits, expected, atol=1e-6)  # adapters taken out again
    assert not torch.allclose(tiny_llama()(input_ids=ids).logits, expected, atol=1e-3)


def test_the_logged_kl_is_k3_never_negative_where_the_mean_log_ratio_is() -> None:
    """Tokens the update made likelier: the k1 estimate (mean of old - new log-prob) is
    negative, a KL cannot be; the logged figure is k3, ``r - 1 - log r`` per token."""
    from agentgym.trainers.algorithms import Bounds
    from agentgym.trainers.update import update_sums

    record = {"token_ids": [3, 7, 11, 5], "loss_mask": [0, 1, 1, 1], "logprobs": [0.0, -2.0, -1.0, -3.0]}
    micro = collate([record], [1.0], pad_id=0).weighted("token-mean")
    logp = torch.tensor([[0.0, -1.5, -0.5, -2.9]])  # every agent token likelier now
    ratio = torch.exp(logp - micro.old_logp)
    sums = update_sums(micro, ratio, logp, torch.zeros_like(logp), Bounds(0.8, 1.2), torch.zeros_like(logp))
    k1 = float(((micro.old_logp - logp) * micro.loss_mask).sum())
    r = ratio[0, 1:]
    assert k1 < 0 and float(sums[6]) > 0
    assert float(sums[6]) == pytest.approx(float((r - 1 - r.log()).sum()), rel=1e-5)
