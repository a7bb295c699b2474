"""Our envs and algorithms on TRL's GRPOTrainer (``agentgym.trainers.trl_engine``), against
real env servers: TRL's update equals our learner's on the same batch, the horizon and the
rewards TRL logs are the episodes', and TRL with our plug-in learns ``choice`` from reward
alone as our own trainer does (tests/test_trainer.py)."""

from __future__ import annotations

import asyncio
import copy
import json
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from test_trainer import LEARNING_STEPS, choice_config
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.contract.errors import UsageError
from agentgym.policies.hf import HFPolicy
from agentgym.policies.models import LoadedModel, ModelSource
from agentgym.records.run_folder import MetricsLog
from agentgym.trainers.algorithms import ADVANTAGE_ESTIMATORS
from agentgym.trainers.batch import TokenBatch, per_token
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.distributed import DataParallel
from agentgym.trainers.learner import Learner
from agentgym.trainers.loop import split_task_ids
from agentgym.trainers.trl_engine import run as run_module
from agentgym.trainers.trl_engine.build import check_for_trl, grpo_args, trl_trainer
from agentgym.trainers.trl_engine.episodes import EnvEpisodes
from agentgym.trainers.trl_engine.grpo import AgentGymGRPOTrainer
from agentgym.trainers.trl_engine.run import launch_command, train_on_trl
from agentgym.trainers.update import clipped_update
from conftest import REPO, all_records, run_cli


def tasks(url: str, split: str) -> list[str]:
    return asyncio.run(split_task_ids(url))[1][split]


class Recorded:
    """What a TRL run did at each optimizer step (weights before it, its micro-batches, the
    bounds it set, the loss it summed) and each round's episodes."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.steps: list[dict[str, Any]] = []
        self.rounds: list[Any] = []
        set_bounds, compute_loss = AgentGymGRPOTrainer._set_bounds, AgentGymGRPOTrainer._compute_loss
        play = EnvEpisodes.__call__

        def recording_bounds(trainer: AgentGymGRPOTrainer, model: Any) -> None:
            spg = trainer.args.steps_per_generation
            window = [
                trainer._buffered_inputs[(trainer._step + i) % spg]
                for i in range(trainer.current_gradient_accumulation_steps)
            ]
            unwrapped = trainer.accelerator.unwrap_model(model)
            weights = {k: v.detach().clone() for k, v in unwrapped.state_dict().items()}
            set_bounds(trainer, model)
            bounds = (1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
            self.steps.append(
                {"weights": weights, "window": copy.deepcopy(window), "bounds": bounds, "loss": 0.0}
            )

        def recording_loss(trainer: AgentGymGRPOTrainer, model: Any, inputs: dict) -> torch.Tensor:
            loss = compute_loss(trainer, model, inputs)
            self.steps[-1]["loss"] += float(loss.detach())
            return loss

        def recording_play(episodes: EnvEpisodes, prompts: list[str], trainer: Any) -> dict:
            out = play(episodes, prompts, trainer)
            self.rounds.append(episodes.last)
            return out

        monkeypatch.setattr(AgentGymGRPOTrainer, "_set_bounds", recording_bounds)
        monkeypatch.setattr(AgentGymGRPOTrainer, "_compute_loss", recording_loss)
        monkeypatch.setattr(EnvEpisodes, "__call__", recording_play)


def as_token_batch(window: list[dict[str, torch.Tensor]], pad_id: int) -> TokenBatch:
    """TRL's micro-batches (left-padded prompts, right-padded completions) as one of our
    right-padded minibatches, token for token."""
    rows = []
    for micro in window:
        for i in range(len(micro["prompt_ids"])):
            prompt = micro["prompt_ids"][i][micro["prompt_mask"][i].bool()]
            real = micro["completion_mask"][i].bool()
            agent = (micro["completion_mask"][i] * micro["tool_mask"][i])[real].float()
            zeros = torch.zeros(len(prompt))
            rows.append({
                "input_ids": torch.cat([prompt, micro["completion_ids"][i][real]]),
                "loss_mask": torch.cat([zeros, agent]),
                "old_logp": torch.cat([zeros, micro["old_per_token_logps"][i][real] * agent]),
                "advantages": torch.cat([zeros, micro["advantages"][i][real] * agent]),
                "allowed": torch.cat([
                    torch.full((len(prompt), micro["allowed"].shape[-1]), -1), micro["allowed"][i][real]
                ]),
            })  # fmt: skip
    length, depth = max(len(r["input_ids"]) for r in rows), max(r["allowed"].shape[1] for r in rows)
    ids, attention = torch.full((len(rows), length), pad_id), torch.zeros(len(rows), length)
    mask, old, advantages = (torch.zeros(len(rows), length) for _ in range(3))
    allowed = torch.full((len(rows), length, depth), -1)
    for row, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[row, :n], attention[row, :n], mask[row, :n] = r["input_ids"], 1, r["loss_mask"]
        old[row, :n], advantages[row, :n] = r["old_logp"], r["advantages"]
        allowed[row, :n, : r["allowed"].shape[1]] = r["allowed"]
    batch = TokenBatch(ids, attention, mask, old, advantages, torch.zeros(len(rows), length), allowed)
    return batch.weighted("token-mean")


class LearnerContext:
    """The narrow trainer view ``clipped_update`` reads."""

    def __init__(self, config: TrainConfig, learner: Learner) -> None:
        self.config, self.learner, self.dp, self.version = config, learner, DataParallel(), 0

    def minibatch(self, batch: TokenBatch) -> TokenBatch:
        return batch.weighted("token-mean")


def test_bad_configs_are_refused_before_any_model_loads() -> None:
    with pytest.raises(UsageError) as refused:
        check_for_trl(TrainConfig(algo="grpo"))
    for expected in ("bc_steps: 16", "curriculum: 'fits-horizon'", "loss_aggregation 'seq-mean'"):
        assert expected in str(refused.value)
    with pytest.raises(UsageError, match="trains in its own regime"):
        check_for_trl(TrainConfig(algo="agentevol", bc_steps=0, curriculum="all"))
    with pytest.raises(UsageError, match="minibatch_size"):
        check_for_trl(choice_config("bapo", curriculum="all", minibatch_size=24))


TINY_BAPO = dict(
    algo="bapo", env="textworld", schedule="scaling-inter", rounds=[1, 2], interval=1, bc_steps=0, steps=2,
    tasks_per_step=2, group_size=4, max_new_tokens=6, minibatch_size=4, micro_batch_size=2, ppo_epochs=2,
    curriculum="all", entropy_coef=0.05, lora=False, learning_rate=5e-3, loss_aggregation="token-mean",
    command_mass_coef=0.5,
)  # fmt: skip
"""BAPO on textworld with the tiny model, all weights trained: two rounds (ScalingInter-RL's
horizon 1, then 2), two passes over each round's episodes, so the second pass is
off-policy and BAPO's search acts; an entropy term, the forced-end and command-mass terms, on."""


def tiny_bapo_config(model_dir: Path, **overrides: Any) -> TrainConfig:
    return TrainConfig(**(TINY_BAPO | {"model": str(model_dir)} | overrides))


def assert_our_learner_agrees(
    config: TrainConfig, model_dir: Path, tokenizer: Any, steps: list[dict]
) -> None:
    """Each recorded optimizer step (``weights`` before it, its micro-batches ``window``,
    the ``bounds`` TRL used, the ``loss`` summed over the window) against our learner from
    the same weights on the same rows: bounds within 1e-6, loss within 1e-5; BAPO must
    have searched on the off-policy passes."""
    # A fresh model: TRL patched its own model's forward (a closure over that very model).
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    policy = HFPolicy.around(LoadedModel(model, tokenizer, ModelSource("tiny", str(model_dir))), "tiny")
    learner = Learner(config, policy, DataParallel())
    searched = 0
    for step in steps:
        model.load_state_dict(step["weights"])
        batch = as_token_batch(step["window"], tokenizer.pad_token_id)
        ours = clipped_update(LearnerContext(config, learner), batch, kl_coef=0.0)
        bounds = (ours.get("clip_low", 0.6), ours.get("clip_high", 1.2))  # on-policy: the start bounds
        assert step["bounds"] == pytest.approx(bounds, abs=1e-6)
        assert step["loss"] == pytest.approx(ours["loss"], abs=1e-5)
        searched += ours.get("bapo_search", "on-policy") != "on-policy"
    assert searched >= 2 or config.clip_rule != "bapo"  # BAPO: the second passes search
    asyncio.run(policy.close())


def test_trl_update_is_our_learners_on_the_same_batch(
    textworld_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At every optimizer step TRL's loss and bounds are what our learner computes from the
    same weights on the same micro-batches; weights change; the rewards and turn limits
    TRL logs are the episodes'."""
    config = tiny_bapo_config(tiny_model_dir)
    recorded = Recorded(monkeypatch)
    args = grpo_args(config, str(tmp_path))
    trainer = trl_trainer(config, textworld_url, tasks(textworld_url, "train"), args)
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    trainer.episodes.close()

    assert any((p != b).any() for p, b in zip(trainer.model.parameters(), before, strict=True))
    rounds = [log for log in trainer.state.log_history if "reward" in log]
    assert [played.max_turns for played in recorded.rounds] == [1, 2] == [log["max_turns"] for log in rounds]
    for played, log in zip(recorded.rounds, rounds, strict=True):
        assert all(e.turns <= played.max_turns and not e.errored for e in played.episodes)
        assert log["reward"] == pytest.approx(sum(e.score for e in played.episodes) / len(played.episodes))
    assert len(recorded.steps) == 8  # 2 rounds x 2 passes x 2 minibatches
    assert_our_learner_agrees(config, tiny_model_dir, trainer.processing_class, recorded.steps)


def test_trl_trains_a_bfloat16_model_on_a_multi_turn_env(
    textworld_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Under accelerate's bfloat16 mixed precision TRL's model hands back its outputs in
    float32: our scoring runs the output layer in the layer's own dtype (it failed on
    textworld before: float hidden states against a bfloat16 head)."""
    config = tiny_bapo_config(tiny_model_dir, steps=1, ppo_epochs=1, dtype="bfloat16")
    args = grpo_args(config, str(tmp_path / "trl"))
    assert args.bf16
    trainer = trl_trainer(config, textworld_url, tasks(textworld_url, "train"), args)
    try:
        trainer.train()
    finally:
        trainer.episodes.close()
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    assert torch.isfinite(torch.tensor(trainer.state.log_history[0]["loss"]))


def test_gigpo_on_trl_trains_on_our_per_turn_advantages(
    textworld_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GiGPO's advantages are per agent turn: on TRL each completion token carries its
    turn's, as our collector computes them for the same episodes; the update is our
    learner's."""
    config = tiny_bapo_config(tiny_model_dir, algo="gigpo", schedule="fixed", max_turns=3, steps=1)
    recorded = Recorded(monkeypatch)
    scored = AgentGymGRPOTrainer._generate_and_score_completions
    outputs = []
    monkeypatch.setattr(
        AgentGymGRPOTrainer,
        "_generate_and_score_completions",
        lambda trainer, inputs: outputs.append(scored(trainer, inputs)) or outputs[-1],
    )
    trainer = trl_trainer(
        config, textworld_url, tasks(textworld_url, "train"), grpo_args(config, str(tmp_path))
    )
    trainer.train()
    trainer.episodes.close()
    (played,), (output,) = recorded.rounds, outputs
    group_ids = torch.arange(len(played.episodes)) // config.group_size
    expected = ADVANTAGE_ESTIMATORS["gigpo"](played.episodes, group_ids)
    per_turn = 0
    for row, (episode, start) in enumerate(zip(played.episodes, played.prompt_lengths, strict=True)):
        tokens = torch.tensor(per_token(expected[row], episode.loss_mask)[start:])
        assert torch.allclose(output["advantages"][row, : len(tokens)], tokens)
        per_turn += len({round(float(v), 6) for v in tokens[tokens != 0]}) > 1
    groups = [
        played.episodes[i : i + config.group_size] for i in range(0, len(played.episodes), config.group_size)
    ]
    # A group whose episodes scored differently credits the turns of its episodes differently.
    assert per_turn or not any(len({e.score for e in group}) > 1 for group in groups)
    assert_our_learner_agrees(config, tiny_model_dir, trainer.processing_class, recorded.steps)


def test_two_processes_under_accelerate_give_the_losses_of_one_and_write_one_run(
    textworld_url: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentgym train --engine trl --nproc 2``: ``accelerate launch`` of two CPU processes
    (gloo), each playing and scoring its half of a round. At every optimizer step both hold
    the same weights and bounds, and their mean loss is our learner's on the two halves
    together (the standard of our own data-parallel test); the run folder holds one record
    of the whole round, its episodes, a checkpoint and the held-out panel, as one process
    writes it. The launched entry point is ``tests/trl_ranks_job.py``: ours, recording."""
    job = str(Path(__file__).parent / "trl_ranks_job.py")

    def recording_launch(nproc: int, run_dir: Path, resume: bool = False) -> list[str]:
        command = launch_command(nproc, run_dir, resume)
        at = command.index("-m", command.index("--num_processes"))
        assert command[at : at + 2] == ["-m", "agentgym.trainers.trl_engine.run"]
        return [*command[:at], job, *command[at + 2 :]]

    monkeypatch.setattr(run_module, "launch_command", recording_launch)
    # The job imports test_trl, which imports the repository's conftest.py.
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    config = tiny_bapo_config(tiny_model_dir, steps=1, micro_batch_size=1)
    settings = {key: getattr(config, key) for key in [*TINY_BAPO, "model"]} | {
        "env_url": textworld_url, "eval_tasks": 2, "report_to": []
    }  # fmt: skip
    flags = [arg for key, value in settings.items() for arg in ("--set", f"{key}={json.dumps(value)}")]
    run = tmp_path / "run"
    code, output = run_cli("train", "--engine", "trl", "--nproc", "2", "--out", str(run), *flags)
    assert code == 0, output

    ranks = [torch.load(run / f"rank-{r}.pt", weights_only=False) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 4  # one round, two passes, two optimizer steps each
    steps = []
    for first, second in zip(*ranks, strict=True):
        assert all(torch.equal(first["weights"][k], second["weights"][k]) for k in first["weights"])
        assert first["bounds"] == second["bounds"]
        steps.append({
            "weights": first["weights"], "window": first["window"] + second["window"],
            "bounds": first["bounds"], "loss": (first["loss"] + second["loss"]) / 2,
        })  # fmt: skip
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert_our_learner_agrees(config, tiny_model_dir, tokenizer, steps)

    start, step = all_records(run)
    assert start["step"] == 0 and "eval_success_rate" in start
    assert step["step"] == 1 and step["episodes"] == 8 and "eval_success_rate" in step  # both ranks' halves
    assert len((run / "rollouts" / "step-000001.jsonl").read_text().splitlines()) == 8
    assert (run / "checkpoints" / "step-000001").is_dir() and (run / "manifest.json").exists()


TRL_CHOICE = {"curriculum": "all", "tasks_per_step": 2, "learning_rate": 1e-3, "rl_learning_rate": 1e-3}
"""Our learning test's settings (tests/test_trainer.py) at half the episodes a step and twice
the learning rate, to keep the suite's time: held-out 1.0 at step 6 on seeds 0-2
(bench/RESULTS.md, "TRL and our engine side by side")."""


def test_train_engine_trl_learns_choice_and_leaves_a_run_eval_plays(choice_url: str, tmp_path: Path) -> None:
    """``agentgym train --engine trl``: SmolLM2-135M with BAPO on TRL learns `choice` from
    reward alone (held-out greedy success from chance to our learning test's threshold,
    0.9), writes a step record, episodes and a checkpoint per round, and ``agentgym eval``
    plays the run folder as the run's own evaluation did."""
    run = tmp_path / "run"
    settings = choice_config("bapo", kl_coef=0.0, env_url=choice_url, **TRL_CHOICE).to_dict()
    chosen = ("env_url", "schedule", "max_turns", "bc_steps", "steps", "group_size", "max_new_tokens",
              "agent_format", "minibatch_size", "micro_batch_size", "eval_tasks", "kl_coef", *TRL_CHOICE)  # fmt: skip
    flags = [arg for key in chosen for arg in ("--set", f"{key}={settings[key]}")]
    code, output = run_cli(
        "train", "--engine", "trl", "--algo", "bapo", "--env", "choice", "--out", str(run), *flags
    )
    assert code == 0, output
    start, *steps = all_records(run)
    print(f"\nTRL + BAPO on choice: success by step {[round(r['success_rate'], 2) for r in steps]}, "
          f"held-out {start['eval_success_rate']:.2f} -> {steps[-1]['eval_success_rate']:.2f}")  # fmt: skip
    assert [r["step"] for r in steps] == list(range(1, LEARNING_STEPS + 1))
    assert start["eval_success_rate"] <= 0.5  # the untrained model, greedy: near chance (0.25)
    assert steps[-1]["eval_success_rate"] >= 0.9
    assert all(r["max_turns"] == 1 and r["episodes"] == 16 for r in steps)
    assert len((run / "rollouts" / "step-000006.jsonl").read_text().splitlines()) == 16
    assert (run / "checkpoints" / "step-000006").is_dir() and (run / "play.json").exists()

    code, output = run_cli("eval", "--model", str(run), "--env", "choice", "--url", choice_url,
                           "--n", "16", "--out", str(tmp_path / "eval"))  # fmt: skip
    assert code == 0, output
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    # Greedy play of the exported weights (LoRA merged) may break a near-tie differently.
    assert abs(results["success_rate"] - steps[-1]["eval_success_rate"]) <= 2 / 16


def test_train_engine_trl_refuses_what_trl_cannot_run_before_loading_a_model() -> None:
    code, output = run_cli("train", "--engine", "trl", "--env", "choice")
    assert code == 2 and "cannot run on TRL" in output and "curriculum: 'fits-horizon'" in output, output
    code, output = run_cli("train", "--engine", "nope")
    assert code == 2 and "--engine must be one of ours, trl" in output, output


def test_the_docs_example_trains_on_trl(
    choice_url: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``docs/examples/trl_bapo.py`` as a user runs it (the tiny model, one step), run as
    ``__main__`` in this process: TRL is imported here already."""
    example = REPO / "docs" / "examples" / "trl_bapo.py"
    argv = [str(example), "--url", choice_url, "--model", str(tiny_model_dir), "--steps", "1",
            "--out", str(tmp_path / "trl")]  # fmt: skip
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", argv)
        runpy.run_path(str(example), run_name="__main__")
    printed = capsys.readouterr().out
    assert "optimizer step 1: reward" in printed, printed


TINY_TRL = {"algo": "bapo", "env": "choice", "bc_steps": 0, "curriculum": "all", "schedule": "fixed",
            "max_turns": 1, "steps": 1, "tasks_per_step": 2, "group_size": 2, "minibatch_size": 4,
            "micro_batch_size": 2, "max_new_tokens": 4, "agent_format": "plain", "eval_tasks": 2,
            "loss_aggregation": "token-mean", "report_to": []}  # fmt: skip
"""One round of BAPO on ``choice`` with the tiny model: 4 episodes, one optimizer step."""


def test_a_trl_run_resumes_from_its_newest_round(
    choice_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``train --engine trl --resume`` continues from TRL's checkpoint of the last round: its
    optimizer step count and Adam state carry on, a record logged after that checkpoint
    (a crash between the two) is cut and the round trained again, no record is repeated."""
    config = TrainConfig(
        **TINY_TRL, env_url=choice_url, model=str(tiny_model_dir), output_dir=str(tmp_path / "run")
    )
    run = train_on_trl(config, tmp_path / "run")
    config.with_overrides({"steps": 3}).save(run / "config.yaml")  # the run meant to go on
    MetricsLog(run / "metrics.jsonl").log({"step": 2, "phase": "rl", "torn": True})  # logged, never saved
    code, output = run_cli("train", "--engine", "trl", "--resume", "--out", str(run))
    assert code == 0, output
    records = all_records(run)
    assert [r["step"] for r in records] == [0, 1, 2, 3] and not any(r.get("torn") for r in records)
    assert "eval_success_rate" in records[0] and "eval_success_rate" in records[-1]
    state = json.loads((run / "checkpoints" / "step-000003" / "state.json").read_text())
    assert state["trl_global_step"] == 3  # one optimizer step a round, counted on from the checkpoint
    (newest,) = (run / "trl").glob("checkpoint-*")
    optimizer = torch.load(newest / "optimizer.pt", weights_only=False)
    assert {int(s["step"]) for s in optimizer["state"].values()} == {3}  # Adam's count carried on
