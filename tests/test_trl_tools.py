"""TRL's ``environment_factory`` over our env servers (``trainers/trl_engine/tools.py``): the
env object against a real textworld server, and a TRL run whose model calls it as a tool."""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer
from trl import GRPOTrainer
from trl.chat_template_utils import qwen2_5_chat_template

from agentgym.clients.env_client import EnvClient
from agentgym.contract.errors import UnknownSession, UnknownTask, UsageError
from agentgym.policies import models
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.loop import split_task_ids
from agentgym.trainers.trl_engine.build import grpo_args, tools_trainer
from agentgym.trainers.trl_engine.tools import EnvSession

COMMAND = "look"
"""A command every textworld game takes."""


def train_tasks(url: str) -> list[str]:
    return asyncio.run(split_task_ids(url))[1]["train"]


def expert_commands(url: str, task_id: str) -> list[str]:
    """The env's expert's commands for ``task_id``, played in a session of their own."""
    with EnvClient(url) as client:
        created = client.create(task_id, split="train")
        commands, info = [], created.info
        while info.get("expert_action"):
            commands.append(info["expert_action"])
            step = client.step(created.session_id, commands[-1])
            info = step.info
            if step.terminated or step.truncated:
                break
        client.delete(created.session_id)
    return commands


def test_env_session_plays_to_the_end_or_the_horizon_and_leaves_no_session(textworld_url: str) -> None:
    first, second = train_tasks(textworld_url)[:2]
    commands = expert_commands(textworld_url, first)
    horizon = [len(commands) + 5]
    env = EnvSession(textworld_url, lambda: horizon[0])
    shown = env.reset(task_id=first, prompt=[{"role": "user", "content": "ignored"}])  # TRL passes the row
    assert "Valid commands:" in shown and env.get_reward() == 0.0
    for command in commands[:-1]:
        assert "The episode is over." not in env.act(command)
    assert env.act(commands[-1]).endswith("The episode is over.")
    assert env.get_reward() == 1.0  # the expert won: the env's score
    with pytest.raises(ValueError, match="episode is over"):
        env.act(COMMAND)

    horizon[0] = 2  # ScalingInter-RL's limit for the next rollout, read at reset
    env.reset(task_id=second)
    session = env.session_id
    other = EnvSession(textworld_url, lambda: 2)
    other.reset(task_id=second)
    assert other.session_id != session  # one session per rollout: nothing shared
    assert "The episode is over." not in env.act(COMMAND)
    assert env.act(COMMAND).endswith("The episode is over.") and env.turns == 2
    with EnvClient(textworld_url) as client, pytest.raises(UnknownSession):
        client.state(session)  # ended episodes are deleted on the server at once
    assert client is not None and other.act(COMMAND)  # the other rollout plays on
    with pytest.raises(UnknownTask):
        other.reset(task_id="no-such-task")


def tool_calling_model(tiny_model_dir: Path, folder: Path) -> Path:
    """The tiny model under TRL's Qwen2.5 chat template, which renders tool calls and whose
    replies TRL parses (SmolLM2's own renders none)."""
    shutil.copytree(tiny_model_dir, folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(folder)
    return folder


def always_calling(folder: Path, command: str) -> list[list[Any]]:
    """Generation's ``sequence_bias`` that makes every assistant turn the call
    ``act(command)``: each token of the call gets +100 where the tokens before it, back to
    the turn's opening, are the call's (the untrained model's own logits are about ±1)."""
    tokenizer = AutoTokenizer.from_pretrained(folder)
    opening = tokenizer("<|im_start|>assistant\n")["input_ids"]
    call = json.dumps({"name": "act", "arguments": {"command": command}})
    ids = tokenizer(f"<tool_call>\n{call}\n</tool_call><|im_end|>")["input_ids"]
    return [[opening + ids[: i + 1], 100.0] for i in range(len(ids))]


def tools_config(model: Path | str, **overrides: Any) -> TrainConfig:
    values = dict(
        algo="grpo", env="textworld", model=str(model), schedule="fixed", max_turns=2, bc_steps=0, steps=1,
        tasks_per_step=2, group_size=2, minibatch_size=4, micro_batch_size=2, curriculum="all",
        loss_aggregation="token-mean", kl_coef=0.0, lora=False, learning_rate=1e-3,
    )  # fmt: skip
    return TrainConfig(**(values | overrides))


def test_trl_plays_our_env_through_tool_calls(
    textworld_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A TRL round with our env as ``environment_factory``, its model calling ``act("take
    coin")`` every turn: the calls reach the env server; the coin task is won by the first
    (its next call is refused: the episode is over), the other task's rollouts stop at the
    schedule's horizon (2 commands); the env's answers are masked from the loss; the reward
    TRL logs is the env's score; no session is left on the server."""
    coin, other = train_tasks(textworld_url)[:2]  # coin collector, won by "take coin"; a treasure hunt
    model = tool_calling_model(tiny_model_dir, tmp_path / "model")
    config = tools_config(model)
    inputs: list[dict[str, Any]] = []
    compute_loss = GRPOTrainer._compute_loss

    def recording_loss(trainer: GRPOTrainer, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        inputs.append(batch)
        return compute_loss(trainer, model, batch)

    monkeypatch.setattr(GRPOTrainer, "_compute_loss", recording_loss)
    bias = always_calling(model, "take coin")
    args = grpo_args(
        config, str(tmp_path / "trl"), max_completion_length=400, generation_kwargs={"sequence_bias": bias}
    )
    trainer = tools_trainer(config, textworld_url, [coin, other], args)
    trainer.train()

    sessions = trainer._environment_pool[None]
    played = sorted((s.task_id, s.turns, s.get_reward()) for s in sessions)
    assert played == [(coin, 1, 1.0)] * 2 + [(other, 2, 0.0)] * 2
    assert all(s.session_id is None for s in sessions)
    logged = {k: v for record in trainer.state.log_history for k, v in record.items()}
    assert logged["tools/call_frequency"] == 2.0  # every rollout called twice ...
    assert logged["tools/failure_frequency"] > 0  # ... and the won episodes' second call was refused
    assert logged["rewards/EnvSession/mean"] == pytest.approx(0.5)
    assert inputs and torch.isfinite(torch.tensor(logged["loss"]))
    masked = torch.cat([(b["completion_mask"] * (1 - b["tool_mask"])).flatten() for b in inputs])
    assert masked.sum() > 0  # the env's answers sit in the completions, masked from the loss


def test_tools_path_refuses_before_any_model_loads(
    textworld_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_load(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a model loaded before the config was checked")

    monkeypatch.setattr(models, "load_causal_lm", no_load)
    config = tools_config("smollm2-135m", algo="bapo")  # SmolLM2's template renders no tool calls
    with pytest.raises(UsageError) as refused:
        tools_trainer(config, textworld_url, ["t"], grpo_args(config, str(tmp_path)))
    for expected in ("bapo clip rule", "cannot render tool calls"):
        assert expected in str(refused.value)
