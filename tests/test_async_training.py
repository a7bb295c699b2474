"""Off-policy and asynchronous training end to end: a real (tiny) model trained on real
env servers on loopback, in sync and async mode, with replay and partial rollouts.

The tiny random model never solves a task, so its advantages are 0; an entropy bonus
makes every update move the policy anyway, which is what staleness and importance ratios
need to be visible.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agentgym.agents.tokens import sampled_versions
from agentgym.records.trajectory import Trajectory, read_jsonl, read_trajectories
from agentgym.trainers.loop import Trainer
from agentgym.trainers.plot import plot_run
from conftest import run_metrics, short_rl_config


def rollouts(run: Path, step: int) -> list[Trajectory]:
    return read_trajectories(run / "rollouts" / f"step-{step:06d}.jsonl")


def sampled(trajectory: Trajectory) -> list[int]:
    return sampled_versions(trajectory.versions, trajectory.loss_mask)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("algo", ["bapo", "grpo", "ppo"])
def test_each_algorithm_trains_in_each_mode_within_the_staleness_bound(
    algo: str, mode: str, tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    run = Trainer(short_rl_config(tiny_model_dir, choice_url, "choice", algo=algo, mode=mode), tmp_path).run()
    history = run_metrics(run)
    assert [r["step"] for r in history] == [1, 2, 3] and {r["mode"] for r in history} == {mode}
    for r in history:
        step = r["step"]
        # Sync plays step s with the weights after step s-1; async plays it during step s-1's update.
        behaviour = step - 1 if mode == "sync" or step == 1 else step - 2
        versions = {v for t in rollouts(run, step) for v in sampled(t)}
        assert versions == {behaviour}
        assert r["policy_version"] == step - 1
        assert r["staleness_max"] == r["staleness_mean"] == step - 1 - behaviour <= 1
        (update,) = r["updates"]
        deviation = max(abs(update["ratio_p05"] - 1), abs(update["ratio_p95"] - 1), update["ratio_max"] - 1)
        if step - 1 == behaviour:
            assert deviation < 1e-3  # on-policy: π_θ = π_behaviour up to float error
        else:
            assert deviation > 1e-3  # one update later the ratio moved off 1
        if algo == "bapo" and step - 1 == behaviour:  # every ratio is 1: no search, none logged
            assert update["bapo_search"] == "on-policy" and "clip_high" not in update
        elif algo == "bapo":
            assert update["bapo_search"] in ("reached", "saturated")
            assert 0.6 <= update["clip_low"] <= 0.9 and 1.2 <= update["clip_high"] <= 3.0
            # The step's share of updates whose search moved the bounds off (0.6, 1.2).
            moved = (update["clip_low"], update["clip_high"]) != (0.6, 1.2)
            assert update["bounds_moved"] == float(moved) == float(update["bapo_search_steps"] > 0)
        else:
            assert (update["clip_low"], update["clip_high"]) == (0.8, 1.2)
    assert all(0 <= r["cpu_idle_share"] <= 1 and r["step_s"] > 0 for r in history)


def test_replayed_samples_train_with_their_original_log_probs_and_versions(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    config = short_rl_config(tiny_model_dir, choice_url, "choice", steps=4, replay_ratio=0.5, max_staleness=2)
    run = Trainer(config, tmp_path).run()
    history = run_metrics(run)
    assert [r["replayed_episodes"] for r in history] == [0, 8, 8, 8]  # half of each later batch
    assert [r["staleness_max"] for r in history] == [0, 1, 2, 2]  # replay reaches the bound, never past it
    played = {(t.task_id, t.sample): t for step in range(1, 5) for t in rollouts(run, step)}
    kept = list(read_jsonl(run / "checkpoints" / "step-000004" / "replay.jsonl"))
    assert kept
    for record in kept:
        replayed = Trajectory.from_dict(record["trajectory"])
        original = played[(replayed.task_id, replayed.sample)]
        assert replayed.token_ids == original.token_ids
        assert replayed.logprobs == original.logprobs
        assert replayed.versions == original.versions


def test_partial_rollouts_resume_under_newer_policies_and_drop_what_turns_too_stale(
    tiny_model_dir: Path, textworld_url: str, tmp_path: Path
) -> None:
    config = short_rl_config(
        tiny_model_dir,
        textworld_url,
        "textworld",
        algo="bapo",
        mode="async",
        max_turns=3,
        steps=5,
        tasks_per_step=1,
        group_size=2,
        max_new_tokens=6,
        agent_format="react",
        minibatch_size=4,
        partial_rollout_tokens=4,  # every turn spends the budget: an episode spans three steps
        max_staleness=2,
    )
    run = Trainer(config, tmp_path).run()
    history = run_metrics(run)
    assert all(r["staleness_max"] <= 2 for r in history)
    assert history[0]["paused_episodes"] > 0 and "skipped" in history[0]
    trained = [r for r in history if r["fresh_episodes"]]
    assert trained, history
    resumed = [t for step in range(1, 6) for t in rollouts(run, step) if len(set(sampled(t))) > 1]
    assert resumed  # episodes whose turns were sampled by successive policies
    for trajectory in resumed:
        versions = sampled(trajectory)
        assert versions == sorted(versions) and trajectory.turns == 3
    # The groups started while the previous episodes were paused would train 3 versions late.
    assert history[-1]["dropped_paused"] > 0


def test_an_async_run_resumes_with_its_replay_buffer(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    config = short_rl_config(
        tiny_model_dir, choice_url, "choice", mode="async", steps=2, replay_ratio=0.5, max_staleness=2
    )
    Trainer(config, tmp_path).run()
    first = (tmp_path / "metrics.jsonl").read_text()
    longer = config.with_overrides({"steps": 3})
    Trainer(longer, tmp_path, resume=True).run()
    history = run_metrics(tmp_path)
    assert [r["step"] for r in history] == [1, 2, 3]
    assert (tmp_path / "metrics.jsonl").read_text().startswith(first)  # steps 1-2 kept, not redone
    assert len(rollouts(tmp_path, 1)) == len(rollouts(tmp_path, 2)) == 8  # played once each
    assert history[2]["replayed_episodes"] == 8  # drawn from the buffer the step-2 checkpoint kept
    assert history[2]["staleness_max"] == 2  # version-0 episodes among them
    # The in-flight collection died with the first process: step 3 is played afresh, at version 2.
    assert {v for t in rollouts(tmp_path, 3) for v in sampled(t)} == {2}
    assert plot_run(tmp_path).stat().st_size > 0  # staleness and ratio panels included
