"""The trainer end to end, with the real model on real env servers.

The learning tests can fail: on `choice` (one turn, one right option among four) an
untrained SmolLM2 rarely names the right colour (chance is 25%); BAPO must lift held-out
success to 90% and GRPO to 75% within a bounded number of steps (bench/RESULTS.md has
both curves). On textworld's coin collector (several turns: which exit, then `take coin`)
GiGPO must raise held-out success on unseen games by 40 points over the untrained policy.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from agentgym.trainers.algorithms import SEARCH_OUTCOMES
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.loop import Trainer
from conftest import REPO, run_cli, run_metrics, served_model, untrained_evaluation

LEARNING_STEPS = 6
"""Both reach 1.0 held-out by step 6 on seeds 0-2 (bench/RESULTS.md, 'one-turn learning tests')."""


def choice_config(algo: str, **overrides: object) -> TrainConfig:
    values = dict(
        algo=algo,
        env="choice",
        schedule="fixed",
        max_turns=1,
        bc_steps=0,
        steps=LEARNING_STEPS,
        tasks_per_step=4,
        group_size=8,
        max_new_tokens=6,
        agent_format="plain",
        learning_rate=5e-4,
        minibatch_size=16,
        micro_batch_size=8,
        eval_every=0,
        eval_tasks=16,
    )
    return TrainConfig(**(values | overrides))


@pytest.fixture(scope="module")
def choice_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A learning run on `choice` of the algorithm ``request.param`` (its folder is named so)."""
    algo = request.param
    # grpo's KL term (0.04, its paper's) gives every episode a gradient, doubling this run's
    # time; what is tested here is learning from the clipped surrogate, so it is left out.
    return Trainer(choice_config(algo, kl_coef=0.0), tmp_path_factory.mktemp("runs") / algo).run()


@pytest.mark.parametrize("choice_run", ["bapo", "grpo"], indirect=True)
def test_policy_learns_the_one_turn_task_from_reward_alone(choice_run: Path) -> None:
    run, algo = choice_run, choice_run.name
    history = run_metrics(run)
    first, last = history[0], history[-1]
    print(
        f"\n{algo}: train success by step {[round(r['success_rate'], 2) for r in history]}, "
        f"held-out success after {LEARNING_STEPS} steps {last['eval_success_rate']:.2f}"
    )
    assert [r["step"] for r in history] == list(range(1, LEARNING_STEPS + 1))
    # Before any update, greedy held-out play fails most tasks. Step 1's sampled success is
    # no such check: its 32 episodes at temperature 1 gave 0.19-0.44 on seeds 0-2
    # (bench/RESULTS.md) and 0.53 in one CI run.
    before = untrained_evaluation(run)["eval_success_rate"]
    assert before <= 0.5
    assert last["eval_success_rate"] >= (0.9 if algo == "bapo" else 0.75)
    assert last["eval_success_rate"] > before
    assert last["success_rate"] > first["success_rate"]
    if algo == "bapo":
        updates = [u for r in history for u in r["updates"]]
        assert {u["bapo_search"] for u in updates} <= set(SEARCH_OUTCOMES)
        searched = [u for u in updates if u["bapo_search"] != "on-policy"]
        assert all(0.6 <= u["clip_low"] <= 0.9 and 1.2 <= u["clip_high"] <= 3.0 for u in searched)
        # Entropy comes from the rows with an advantage; a stand-in-only update reports none.
        assert all(("entropy" in u) == (u["advantage_rows"] > 0) for u in updates)
        assert any(u["advantage_rows"] for u in updates)


@pytest.mark.parametrize("choice_run", ["bapo"], indirect=True)
def test_the_learned_model_ends_its_replies_and_plays_outside_the_trainer(
    choice_run: Path, tmp_path: Path
) -> None:
    """Trained under constrained decoding, the model must still end its reply by itself: in
    plain transformers from the exported folder (bench/stop_check.py: no AgentGym code on
    the path), and served over the OpenAI API, where `eval --policy openai` plays it as the
    run's held-out evaluation did and must score as that evaluation did."""
    exported, held_out = tmp_path / "exported", choice_run / "rollouts" / "eval" / "step-000006.jsonl"
    code, output = run_cli("export", str(choice_run), "--out", str(exported))
    assert code == 0, output
    check = subprocess.run(
        [sys.executable, "bench/stop_check.py", str(exported), str(held_out), "--outcomes", str(tmp_path / "o.json")],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    stops = json.loads(check.stdout.splitlines()[-1])
    assert stops["max_new_tokens"] == 6 and stops["replies"] == 16, check.stdout + check.stderr
    assert stops["stopped"] == 16 and stops["same_as_recorded"] >= 15, stops
    per_task = json.loads((tmp_path / "o.json").read_text())  # bench/pass_at_k.py's stop panel
    assert sum(map(len, per_task.values())) == 16 and sum(map(sum, per_task.values())) == 16

    with served_model(choice_run) as base_url:
        assert httpx.get(f"{base_url}/models").json()["data"][0]["id"] == str(choice_run)
        record = json.loads(held_out.read_text().splitlines()[0])
        prompt = [{"role": m["role"], "content": m["content"]} for m in record["messages"][:2]]
        body = {"messages": prompt, "temperature": 0}  # no max_tokens: the model must stop
        answer = httpx.post(f"{base_url}/chat/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["finish_reason"] == "stop", answer
        assert answer["choices"][0]["message"]["content"].strip() == record["messages"][2]["content"]
        code, output = run_cli("eval", "--env", "choice", "--policy", "openai", "--base-url", base_url,
                                "--model", str(choice_run), "--n", "16", "--out", str(tmp_path / "ev"))  # fmt: skip
    assert code == 0, output
    assert "playing as the run's held-out evaluation did" in output and "constrain_actions True" in output
    results = json.loads((tmp_path / "ev" / "results.json").read_text())
    in_process = run_metrics(choice_run)[-1]["eval_success_rate"]
    assert results["invalid_reply_rate"] == 0.0 and results["rejected_action_rate"] == 0.0
    assert abs(results["success_rate"] - in_process) <= 2 / 16, (results["success_rate"], in_process)


def test_gigpo_learns_textworld_games_it_never_saw(tmp_path: Path) -> None:
    """Multi-turn credit: coin collector games (the coin 0-2 rooms away, 5 turns), no
    cloning, replies constrained to the valid commands. Greedy success on 12 unseen test
    games must rise 40 points above the untrained policy's (its own step-0 evaluation in
    the same run: a trainer that does not learn plays the same greedy moves again)."""
    config = TrainConfig(
        algo="gigpo",
        env="textworld",
        env_settings={"challenges": ["tw-coin_collector"], "n_train": 8, "n_test": 12},
        schedule="fixed",
        max_turns=5,
        bc_steps=0,
        steps=4,
        tasks_per_step=2,  # 4 games a step: 0.75 too on seeds 0-2, at 1.6x the time
        group_size=8,
        agent_format="plain",
        max_new_tokens=8,
        constrain_actions=True,
        rl_learning_rate=3e-3,  # 1e-3 cleared the bar by one game (0.25 -> 0.67); 3e-3: 0.75 on seeds 0-2
        eval_tasks=12,
    )
    run = Trainer(config, tmp_path / "gigpo").run()
    before = untrained_evaluation(run)["eval_success_rate"]
    history = run_metrics(run)
    print(
        f"\ngigpo on coin collector: held-out {before:.2f} untrained, {history[-1]['eval_success_rate']:.2f} "
        f"after {len(history)} steps; train success by step {[round(r['success_rate'], 2) for r in history]}"
    )
    assert [r["step"] for r in history] == [1, 2, 3, 4]
    assert history[-1]["eval_success_rate"] >= before + 0.4
    assert json.loads((run / "heldout.json").read_text())["after_bc"]["mean"] == before


def start_training(out: Path, *extra: str) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "train",
        "--algo",
        "grpo",
        "--schedule",
        "scaling-inter",
        "--env",
        "choice",
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_kill_9_then_resume_continues_without_duplicated_or_missing_steps(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    out = tmp_path / "run"
    settings = [
        f"model={tiny_model_dir}",  # what is tested is the run folder, not what the model learns
        "rounds=[1, 2, 3]",
        "interval=1",
        "steps=3",
        "bc_steps=0",
        "tasks_per_step=2",
        "group_size=2",
        "max_new_tokens=4",
        "agent_format=plain",
        "eval_every=0",
        "eval_tasks=2",
        "micro_batch_size=4",
        "minibatch_size=4",
    ]
    flags = [arg for setting in settings for arg in ("--set", setting)]
    proc = start_training(out, *flags)
    deadline = time.monotonic() + 600
    while not (out / "checkpoints" / "latest").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    children = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    psutil.wait_procs(children, timeout=30)  # the env server follows its parent down
    assert not any(child.is_running() for child in children)
    first_step = (out / "metrics.jsonl").read_text().splitlines()[0]

    resumed = start_training(out, "--resume")
    output, _ = resumed.communicate(timeout=900)
    assert resumed.returncode == 0, output
    history = run_metrics(out)
    assert [r["step"] for r in history] == [1, 2, 3]  # none twice, none missing
    assert (out / "metrics.jsonl").read_text().splitlines()[0] == first_step  # step 1 kept, not redone
    assert [r["max_turns"] for r in history] == [1, 2, 3]  # ScalingInter-RL's horizon per step
    assert (out / "checkpoints" / "step-000003").is_dir() and (out / "curves.png").stat().st_size > 0
    for step in (1, 2, 3):  # a step redone after the kill replaces its rollouts, never appends
        assert len((out / "rollouts" / f"step-{step:06d}.jsonl").read_text().splitlines()) == 4
