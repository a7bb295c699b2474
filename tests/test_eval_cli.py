"""`agentgym eval` and `agentgym collect` as a user runs them, on real textworld servers:
the expert's 100%, a tiny run of the default model, resume, a server killed mid-run, bad
arguments, expert datasets in both formats."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from agentgym.cli import app
from agentgym.records.trajectory import from_agentgym, read_jsonl, read_trajectories
from agentgym.servers.launcher import start_server_process, wait_healthy

pytest.importorskip("textworld")

runner = CliRunner()


def run_eval(*args: str) -> tuple[str, dict]:
    """Invoke ``agentgym eval``; return its output and results.json."""
    result = runner.invoke(app, ["eval", "--env", "textworld", *args])
    assert result.exit_code == 0, result.output
    out = Path(args[args.index("--out") + 1])
    return result.output, json.loads((out / "results.json").read_text())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "no-such-env"], "unknown environment 'no-such-env'"),
        (["--env", "textworld", "--policy", "gpt5"], "unknown policy 'gpt5'"),
        (
            ["--env", "textworld", "--policy", "expert", "--url", "http://127.0.0.1:9"],
            "no AgentGym env server",
        ),
        (["--env", "textworld", "--policy", "expert", "--format", "xml"], "unknown agent format 'xml'"),
        (
            ["--env", "textworld", "--policy", "openai", "--url", "http://127.0.0.1:9"],
            "no AgentGym env server",
        ),
        (
            ["--env", "textworld", "--policy", "expert", "--constrain-actions"],
            "constrain_actions needs policy hf or vllm or openai (--constrain-actions",
        ),
        (
            ["--env", "textworld", "--policy", "expert", "--model", "smollm2-135m"],
            "--policy expert plays the env's expert and no model: drop --model smollm2-135m",
        ),
    ],
)
def test_bad_arguments_exit_2(args: list[str], message: str, tmp_path: Path) -> None:
    result = runner.invoke(app, ["eval", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2 and message in result.output.replace("\n", " ")


def test_bad_collect_arguments_exit_2(textworld_url: str, tmp_path: Path) -> None:
    base = ["collect", "--env", "textworld", "--url", textworld_url, "--out", str(tmp_path / "d.jsonl")]
    assert runner.invoke(app, [*base, "--format", "csv"]).exit_code == 2
    assert runner.invoke(app, [*base, "--policy", "openai"]).exit_code == 2  # needs --base-url and --model
    assert runner.invoke(app, [*base, "--split", "nope"]).exit_code == 2


def test_the_expert_solves_every_test_task(textworld_url: str, tmp_path: Path) -> None:
    output, results = run_eval("--policy", "expert", "--url", textworld_url, "--out", str(tmp_path))
    assert results["success_rate"] == 1.0 and results["errored"] == 0
    assert results["episodes"] == results["tasks"] == 32 and results["pass_at_k"] == {"1": 1.0}
    assert "success_rate" in output and "pass@1" in output
    trajectories = read_trajectories(tmp_path / "trajectories.jsonl")
    assert len(trajectories) == 32 and all(t.end_reason == "terminated" for t in trajectories)
    assert all(t.messages[2]["content"].startswith("Action: ") for t in trajectories)


def test_the_expert_with_an_auto_started_server(tmp_path: Path) -> None:
    _, results = run_eval("--policy", "expert", "--n", "4", "--k", "2", "--out", str(tmp_path))
    assert results["success_rate"] == 1.0 and results["episodes"] == 8
    assert results["pass_at_k"] == {"1": 1.0, "2": 1.0}
    assert (tmp_path / "servers" / "textworld.log").exists()


def test_a_tiny_eval_of_the_default_model_prints_the_table(textworld_url: str, tmp_path: Path) -> None:
    output, results = run_eval(
        "--n",
        "2",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "16",
        "--url",
        textworld_url,
        "--out",
        str(tmp_path),
    )
    assert results["policy"] == "smollm2-135m" and results["episodes"] == 2 and results["errored"] == 0
    assert results["generated_tokens_per_s"] > 0 and 0.0 <= results["success_rate"] <= 1.0
    assert "generated_tokens_per_s" in output and "smollm2-135m" in output
    for trajectory in read_trajectories(tmp_path / "trajectories.jsonl"):
        assert len(trajectory.token_ids) == len(trajectory.loss_mask) == len(trajectory.logprobs)


def test_eval_can_play_as_training_does_constrained_to_valid_commands(
    textworld_url: str, tmp_path: Path
) -> None:
    args = [
        "--n",
        "2",
        "--max-turns",
        "2",
        "--max-new-tokens",
        "24",
        "--url",
        textworld_url,
        "--out",
        str(tmp_path),
    ]
    _, results = run_eval(*args, "--constrain-actions")
    assert results["episodes"] == 2 and results["errored"] == 0
    for trajectory in read_trajectories(tmp_path / "trajectories.jsonl"):
        assert trajectory.invalid_turns == 0 and "Valid commands: " in trajectory.messages[1]["content"]


def test_a_seeded_sampled_rerun_one_episode_at_a_time_replays_every_token(
    textworld_url: str, tmp_path: Path
) -> None:
    """docs/rollout.md: the same ``--seed`` at ``--concurrency 1`` plays the same episodes at
    temperature 1, token for token; another seed plays others."""
    args = ["--n", "2", "--k", "2", "--max-turns", "2", "--temperature", "1", "--concurrency", "1"]
    args += ["--max-new-tokens", "8", "--constrain-actions", "--url", textworld_url]
    played = {}
    for name, seed in (("first", "0"), ("again", "0"), ("other", "1")):
        run_eval(*args, "--seed", seed, "--out", str(tmp_path / name))
        trajectories = read_trajectories(tmp_path / name / "trajectories.jsonl")
        played[name] = {t.key: t.token_ids for t in trajectories}
    assert len(played["first"]) == 4 and played["again"] == played["first"]
    assert played["other"] != played["first"]


def test_resume_refuses_a_folder_played_with_other_settings(textworld_url: str, tmp_path: Path) -> None:
    """Episodes played with 8 turns are never reported as a 3-turn evaluation; more tasks
    (``--n``) extend the same plan."""
    args = ["--policy", "expert", "--n", "2", "--url", textworld_url, "--out", str(tmp_path)]
    _, first = run_eval(*args, "--max-turns", "8")
    assert first["ran"] == 2
    before = (tmp_path / "results.json").read_text()
    refused = runner.invoke(app, ["eval", "--env", "textworld", *args, "--max-turns", "3"])
    assert refused.exit_code == 2, refused.output
    assert "other settings" in refused.output and "max_turns 8 -> 3" in refused.output
    assert (tmp_path / "results.json").read_text() == before  # nothing relabelled
    assert len(read_trajectories(tmp_path / "trajectories.jsonl")) == 2
    more = [*args[:3], "3", *args[4:]]
    _, extended = run_eval(*more, "--max-turns", "8")
    assert (extended["resumed"], extended["ran"], extended["config"]["max_turns"]) == (2, 1, 8)


def test_resume_runs_only_what_is_missing(textworld_url: str, tmp_path: Path) -> None:
    args = ("--policy", "expert", "--n", "4", "--url", textworld_url, "--out", str(tmp_path))
    _, first = run_eval(*args)
    assert first["ran"] == 4
    path = tmp_path / "trajectories.jsonl"
    kept = path.read_text().splitlines()[:3]
    errored = json.loads(kept[2]) | {"end_reason": "error:env_connection", "success": False}
    path.write_text("\n".join([*kept[:2], json.dumps(errored)]) + "\n")
    output, second = run_eval(*args)
    # Two finished pairs are kept; the errored one and the missing one run again.
    assert (second["resumed"], second["ran"], second["episodes"]) == (2, 2, 4)
    assert "| success 4 errors 0 |" in output  # the progress line counts the kept episodes too
    assert second["success_rate"] == 1.0 and second["errored"] == 0
    records = read_trajectories(path)
    assert len(records) == 5 and len({t.key for t in records}) == 4


def test_killing_the_server_mid_eval_errors_its_episodes_only(tmp_path: Path) -> None:
    server = start_server_process("textworld", extra_args=["--log-level", "warning"])
    wait_healthy(server.url, 120, server.process)
    args = [
        "--n",
        "4",
        "--concurrency",
        "2",
        "--max-turns",
        "4",
        "--max-new-tokens",
        "16",
        "--url",
        server.url,
    ]
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "eval",
        "--env",
        "textworld",
        *args,
        "--out",
        str(tmp_path),
    ]
    evaluation = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and evaluation.poll() is None:
            if httpx.get(f"{server.url}/health").json()["sessions"] > 0:
                break
            time.sleep(0.2)
        os.kill(server.process.pid, signal.SIGKILL)  # episodes are in flight now
        output, _ = evaluation.communicate(timeout=240)
    finally:
        server.stop()
        if evaluation.poll() is None:
            evaluation.kill()
    assert evaluation.returncode == 3, output  # errored episodes past --max-error-rate (10%)
    assert "failed for infrastructure reasons" in output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["episodes"] == 4 and results["errored"] > 0
    assert all(kind.startswith("error:env_") for kind in results["error_kinds"])
    assert "error kinds" in output
    assert len(read_trajectories(tmp_path / "trajectories.jsonl")) == 4


def test_collect_writes_expert_datasets(textworld_url: str, tmp_path: Path) -> None:
    base = ["collect", "--env", "textworld", "--split", "train", "--n", "3", "--url", textworld_url]
    result = runner.invoke(app, [*base, "--out", str(tmp_path / "expert.jsonl")])
    assert result.exit_code == 0, result.output and "wrote 3 of 3 episodes" in result.output
    trajectories = read_trajectories(tmp_path / "expert.jsonl")
    assert len(trajectories) == 3 and all(t.success and t.split == "train" for t in trajectories)
    result = runner.invoke(app, [*base, "--format", "agentgym", "--out", str(tmp_path / "agentgym.jsonl")])
    assert result.exit_code == 0, result.output
    items = list(read_jsonl(tmp_path / "agentgym.jsonl"))
    assert {item["item_id"] for item in items} == {f"textworld_{t.task_id}" for t in trajectories}
    for item in items:
        assert [c["from"] for c in item["conversations"][:3]] == ["human", "gpt", "human"]
        back = from_agentgym(item)
        assert back.messages[0]["role"] == "system" and back.messages[2]["content"].startswith("Action: ")


def test_unparsed_replies_and_rejected_actions_are_counted_apart() -> None:
    """A reply that names no action never reaches the env; one the game refuses does: an
    eval that reported only the first showed "invalid 0.000" while the game refused every
    command."""
    from agentgym.play.evaluation import outcome_figures
    from agentgym.records.trajectory import Trajectory

    # Three turns: "look" played, a reply that did not parse, "dance" that the game refused.
    played = {"actions": ["look", None, "dance"], "turns": 3, "invalid_turns": 2}
    episode = Trajectory(env="textworld", task_id="t", policy="m", messages=[], **played)
    figures = outcome_figures([episode])
    assert figures["invalid_reply_rate"] == pytest.approx(1 / 3)
    assert figures["rejected_action_rate"] == pytest.approx(1 / 3)
