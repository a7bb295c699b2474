"""The one dtype rule (agentgym.policies.dtypes): what the trainer, HFPolicy, serve-model
and export load or write, and a bfloat16 update on this CPU against float32."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
import yaml
from test_trainer_recipes import train

from agentgym.policies import dtypes
from agentgym.policies.dtypes import export_dtype, resolve_dtype
from agentgym.policies.hf import HFPolicy
from agentgym.trainers.algorithms import clipped_surrogate
from agentgym.trainers.batch import collate
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from conftest import run_cli


def test_an_explicit_dtype_wins_then_the_trained_one_then_the_devices() -> None:
    cpu = torch.device("cpu")
    assert resolve_dtype("bfloat16", cpu, trained="float32") == torch.bfloat16
    assert resolve_dtype(torch.float16, cpu) == torch.float16
    assert resolve_dtype("auto", cpu, trained="bfloat16") == torch.bfloat16
    assert resolve_dtype(None, "cpu") == torch.float32  # the suite's AGENTGYM_CPU_DTYPE (conftest)
    with pytest.raises(ValueError, match="unknown dtype 'int8'; choose auto or one of bfloat16"):
        resolve_dtype("int8", cpu)
    assert export_dtype(None, "bfloat16") == "bfloat16" and export_dtype("auto", None) == "float32"
    assert export_dtype("float16", "float32") == "float16"


def test_the_config_checks_its_dtype_and_an_old_bf16_key_still_loads(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="dtype must be auto or one of bfloat16, float16, float32"):
        TrainConfig(dtype="fp8")
    for old, new in (("false", "float32"), ("true", "auto")):
        (tmp_path / "old.yaml").write_text(f"algo: grpo\nbf16: {old}\n")
        assert TrainConfig.load(tmp_path / "old.yaml").dtype == new
    assert TrainConfig().with_overrides({"bf16": False}).dtype == "float32"  # --set bf16=false
    assert "bf16" not in TrainConfig().to_dict()


def test_a_bf16_run_plays_serves_and_exports_in_bf16(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    """The dtype a run trained in is recorded, and whoever loads the run follows it."""
    run = tmp_path / "run"
    code, output = train(run, "grpo", tiny_model_dir, env="choice", env_url=choice_url, dtype="bfloat16")
    assert code == 0, output
    assert json.loads((run / "play.json").read_text())["dtype"] == "bfloat16"
    assert yaml.safe_load((run / "config.yaml").read_text())["dtype"] == "bfloat16"
    policy = HFPolicy(str(run), device="cpu")
    asyncio.run(policy.close())
    assert policy.model.dtype == torch.bfloat16
    code, output = run_cli("export", str(run), "--out", str(tmp_path / "export"))
    assert code == 0, output
    card = (tmp_path / "export" / "README.md").read_text()
    assert "weights: bfloat16, the dtype the run trained and was evaluated in" in card
    config = json.loads((tmp_path / "export" / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "bfloat16"
    code, output = run_cli("serve-model", "--model", str(run), "--dtype", "int4", "--port", "1")
    assert code == 2 and "unknown dtype 'int4'" in output  # refused before any model loads


def test_one_bf16_update_on_this_cpu_matches_float32() -> None:
    """SmolLM2-135M with the trainer's default LoRA, one minibatch of real text, behaviour
    log-probs the float32 model's minus 0.05: bf16 weights and compute give the float32
    loss within 0.02 (advantages of ±0.5 and ±1) and a gradient pointing the same way
    (cosine ≥ 0.98, norm within 5%). Measured: loss -0.1085 against -0.1168 (bf16 log-probs
    carry about 3 significant digits, so ratios move by a few percent), cosine 0.994, norms
    0.2059 and 0.2061."""
    figures, old_logp = {}, None
    for dtype in ("float32", "bfloat16"):
        torch.manual_seed(0)  # the same adapters in both
        config = TrainConfig(model="smollm2-135m", dtype=dtype, micro_batch_size=2, learning_rate=0.0)
        learner = Learner(config, HFPolicy(config.model, device="cpu", dtype=dtype), DataParallel())
        batch = collate(text_records(learner.policy.tokenizer), [1.0, -0.5, 0.5, -1.0], pad_id=0)
        if old_logp is None:  # the float32 model's, for both
            with torch.no_grad():
                old_logp = (learner.logprobs(batch)[0].float() - 0.05) * batch.loss_mask
        batch.old_logp = old_logp
        batch = batch.weighted("token-mean")

        def surrogate(micro, learner=learner):
            logp = learner.logprobs(micro)[0].float()
            return clipped_surrogate(logp, micro.old_logp, micro.advantages, clip_low=0.8, clip_high=1.2)

        loss = learner.optimize(batch, surrogate)
        figures[dtype] = (loss, torch.cat([p.grad.float().flatten() for p in learner.trainable]))
        asyncio.run(learner.policy.close())
    (loss32, grad32), (loss16, grad16) = figures["float32"], figures["bfloat16"]
    cosine = torch.nn.functional.cosine_similarity(grad16, grad32, dim=0)
    print(f"\nloss fp32 {loss32:.5f} bf16 {loss16:.5f}; gradient cosine {cosine:.4f}, "
          f"norm fp32 {grad32.norm():.4g} bf16 {grad16.norm():.4g}")  # fmt: skip
    assert grad32.norm() > 0
    assert loss16 == pytest.approx(loss32, abs=0.02)
    assert cosine >= 0.98
    assert grad16.norm() == pytest.approx(grad32.norm().item(), rel=0.05)


def text_records(tokenizer) -> list[dict]:
    """Four short episodes of real text: a 4-token prompt, the rest the reply the loss sees."""
    texts = ["You are in a kitchen. There is a coin.", "go east", "take coin", "You see a red door."]
    records = []
    for i, text in enumerate(texts):
        ids = tokenizer(f"Room {i}: {text} What do you do next?").input_ids
        records.append({"token_ids": ids, "loss_mask": [0] * 4 + [1] * (len(ids) - 4), "logprobs": []})
    return records


def test_auto_on_a_cpu_is_bf16_where_the_cpu_computes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # This machine's flags, read as the rule reads them.
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    assert dtypes.native_bf16_cpu() == ("avx512_bf16" in flags or "amx_bf16" in flags)
    monkeypatch.delenv(dtypes.CPU_DTYPE_VARIABLE)
    monkeypatch.setattr(dtypes, "native_bf16_cpu", lambda: True)
    assert resolve_dtype("auto", "cpu") == torch.bfloat16
    assert resolve_dtype("auto", "cpu", trained="float32") == torch.float32  # a trained model: its own
    monkeypatch.setattr(dtypes, "native_bf16_cpu", lambda: False)  # emulated bf16 is slower
    assert resolve_dtype("auto", "cpu") == torch.float32
    monkeypatch.setenv(dtypes.CPU_DTYPE_VARIABLE, "bfloat16")
    assert resolve_dtype(None, "cpu") == torch.bfloat16
    monkeypatch.setenv(dtypes.CPU_DTYPE_VARIABLE, "int8")
    with pytest.raises(ValueError, match="unknown dtype 'int8'"):
        resolve_dtype(None, "cpu")
