"""What the learning work added, through public surfaces: valid commands shown to the
policy, episodes that end before overflowing the context, invalid actions counted, the
before/after comparison with its paired interval, the collapse guard, and RL's curriculum."""

from __future__ import annotations

import asyncio
import json
import math
import re
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner, Result

from agentgym.agents import shown_order
from agentgym.cli import app
from agentgym.clients.env_client import EnvClient
from agentgym.play.evaluation import list_tasks
from agentgym.play.rollout import EpisodeSpec, RolloutConfig, run_episodes
from agentgym.policies.base import Generation, GenerationRequest, SamplingParams
from agentgym.policies.expert import ExpertPolicy
from agentgym.records.trajectory import read_trajectories
from agentgym.trainers import heldout
from agentgym.trainers.guards import CollapseGuard
from agentgym.trainers.services import TokenizedExpert
from conftest import all_records, run_metrics

COIN = "tw-coin_collector/level1/s0"
"""One turn for the expert: ``take coin``."""
HOUSE = "tw-simple/dense-detailed/s2"
"""Twelve turns for the expert, with long observations."""


def play(url: str, policy: object, task: str, **config: object):
    (trajectory,) = asyncio.run(run_episodes(url, policy, [EpisodeSpec(task)], RolloutConfig(**config)))
    return trajectory


def train_grpo(model: Path, out: Path, settings: dict[str, object]) -> Result:
    """``agentgym train --algo grpo --schedule fixed`` with ``settings`` as ``--set``s; it must succeed."""
    args = ["train", "--algo", "grpo", "--schedule", "fixed", "--model", str(model), "--out", str(out)]
    result = CliRunner().invoke(app, args + [f"--set={k}={v}" for k, v in settings.items()])
    assert result.exit_code == 0, result.output
    return result


def test_the_policy_sees_the_valid_commands_on_every_observation_but_the_last(textworld_url: str) -> None:
    with EnvClient(textworld_url) as client:
        created = client.create(HOUSE)
        valid = created.info["available_actions"]
        client.delete(created.session_id)
    shown = play(textworld_url, ExpertPolicy(), HOUSE, show_actions=True, max_turns=3)
    observations = [m["content"] for m in shown.messages if m["role"] == "user"]
    assert observations[0].endswith("Valid commands: " + " | ".join(shown_order(created.observation, valid)))
    assert len(observations) == 4 and all("\n\nValid commands: " in o for o in observations[:-1])
    assert "Valid commands" not in observations[-1]  # the env truncated the episode there

    finished = play(textworld_url, ExpertPolicy(), COIN, show_actions=True)
    assert finished.success and "Valid commands" not in finished.messages[-1]["content"]
    assert "take coin" in finished.messages[1]["content"].split("Valid commands:")[1]

    listed = play(textworld_url, ExpertPolicy(), HOUSE, show_actions=True, action_order="listed", max_turns=1)
    assert listed.messages[1]["content"].endswith("Valid commands: " + " | ".join(valid))
    assert shown_order(created.observation, valid) != valid  # so the two orders were told apart

    plain = play(textworld_url, ExpertPolicy(), HOUSE, max_turns=3)
    assert not any("Valid commands" in m["content"] for m in plain.messages)


def test_the_order_of_the_valid_commands_is_fixed_per_state_but_not_alphabetical() -> None:
    """A cloned small model learns positions in a list it always sees sorted (bench/RESULTS.md)."""
    commands = [f"go {way}" for way in ("east", "north", "south", "west")] + ["take coin", "take key"]
    orders = [shown_order(f"You are in room {n}.", commands) for n in range(40)]
    assert all(sorted(order) == commands for order in orders)
    assert shown_order("You are in room 0.", commands[::-1]) == orders[0]  # the env's order plays no part
    assert len({order[0] for order in orders}) == len(commands)  # every command is listed first somewhere
    assert sum(order == commands for order in orders) <= 1


def test_an_episode_ends_with_context_full_before_a_reply_could_overflow(textworld_url: str) -> None:
    from transformers import AutoTokenizer

    from agentgym.policies.models import resolve_model

    expert = TokenizedExpert(AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")))
    limit, new_tokens = 700, 16
    trajectory = play(
        textworld_url,
        expert,
        HOUSE,
        max_context_tokens=limit,
        sampling=SamplingParams(max_new_tokens=new_tokens),
    )
    assert trajectory.end_reason == "context_full" and not trajectory.errored
    assert 0 < trajectory.turns < 12
    assert len(trajectory.token_ids) + new_tokens > limit  # the next reply would not have fit
    last_reply = max(i for i, m in enumerate(trajectory.loss_mask) if m and not trajectory.loss_mask[i - 1])
    assert last_reply + new_tokens <= limit  # every reply was asked for with room to finish


class Scripted:
    """A text policy that replies with the given texts in turn."""

    name, tokenizer = "scripted", None

    def __init__(self, replies: list[str]) -> None:
        self.replies = iter(replies)

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        return [Generation(text=next(self.replies)) for _ in requests]

    async def close(self) -> None:
        return None


def test_an_imperfect_teacher_plays_a_seeded_share_of_random_valid_commands() -> None:
    from transformers import AutoTokenizer

    from agentgym.policies.models import resolve_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    valid = ["go north", "go south", "take key", "open door", "eat apple"]
    shown = {"expert_action": "Action: take key", "available_actions": valid, "sample": 0}
    requests = [
        GenerationRequest([], info=shown | {"task_id": f"task-{i // 8}", "turn": i % 8}) for i in range(400)
    ]

    def replies(epsilon: float, seed: int) -> list[str]:
        teacher = TokenizedExpert(tokenizer, epsilon, seed, agent_format="react")
        return [reply.text for reply in asyncio.run(teacher.generate(requests, SamplingParams()))]

    assert set(replies(0.0, 0)) == {"Action: take key"}
    assert set(replies(1.0, 0)) == {f"Action: {action}" for action in valid}
    teacher = replies(0.3, 0)
    assert teacher == replies(0.3, 0) != replies(0.3, 1)  # seeded: the same run, the same demonstrations
    departures = sum(reply != "Action: take key" for reply in teacher)
    assert 0.15 < departures / len(teacher) < 0.33  # 0.3 x 4/5 expected (a draw may be the expert's)

    unlisted = TokenizedExpert(tokenizer, 0.3)  # an env that lists no commands: nothing to draw
    asyncio.run(
        unlisted.generate(
            [
                GenerationRequest([], info=request.info | {"available_actions": None})
                for request in requests[:5]
            ],
            SamplingParams(),
        )
    )
    assert (
        unlisted.blind == unlisted.turns == 5
    )  # so the run stops instead of cloning the expert as the teacher


def test_cloning_takes_the_teachers_won_episodes_and_the_curriculum_the_experts(
    textworld_url: str, tmp_path: Path
) -> None:
    from types import SimpleNamespace

    from transformers import AutoTokenizer

    from agentgym.policies.models import resolve_model
    from agentgym.records.run_folder import RunDir
    from agentgym.trainers.config import TrainConfig
    from agentgym.trainers.distributed import DataParallel
    from agentgym.trainers.services import ExpertDemonstrations

    config = TrainConfig(  # long demonstrations too: the teacher's detours make them longer
        env="textworld",
        bc_teacher_epsilon=0.25,
        bc_episodes=3,
        curriculum="fits-horizon",
        bc_max_tokens=20_000,
    )
    tasks = asyncio.run(list_tasks(textworld_url, "train", None))[:3]  # two 1-turn games, a long one
    run = SimpleNamespace(config=config, run_dir=RunDir(tmp_path), dp=DataParallel(), url=textworld_url,
                          tokenizer=AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")),
                          train_tasks=tasks, complete=asyncio.run)  # fmt: skip
    demos = ExpertDemonstrations(run)
    cloned = demos.cloneable()
    expert = {e.task_id: e.actions for e in demos.episodes()}
    assert {e.task_id for e in cloned} <= set(tasks)
    assert set(expert) == set(tasks)  # every task: the curriculum's
    assert all(e.success for e in cloned) and (tmp_path / "teacher.jsonl").exists()
    assert any(e.actions != expert[e.task_id] for e in cloned)  # the teacher strayed, and still won
    assert demos.turns() == {task: len(actions) for task, actions in expert.items()}


def test_invalid_turns_count_unparseable_replies_and_unlisted_commands(textworld_url: str) -> None:
    replies = ["I would like to look around", "Action: dance wildly", "Action: look", "Action: take coin"]
    trajectory = play(textworld_url, Scripted(replies), COIN)
    assert trajectory.success and trajectory.turns == 4
    assert trajectory.invalid_turns == 2  # no Action line; "dance wildly" is not a valid command


def test_before_after_pairs_outcomes_per_task_with_a_hand_computed_interval() -> None:
    before = {"a": 0.0, "b": 1.0, "c": 0.0, "d": 0.0, "only-before": 1.0}
    after = {"a": 1.0, "b": 1.0, "c": 1.0, "d": 0.0}
    result = heldout.compare([(before, after)])
    assert (result.after_bc.mean, result.after_rl.mean, result.gain.mean) == (0.25, 0.75, 0.5)
    half = 1.959964 * math.sqrt(1 / 3) / 2  # differences 1, 0, 1, 0: sd sqrt(1/3), n = 4
    assert result.gain.per_episode.low == pytest.approx(0.5 - half, abs=1e-5)
    # Intervals stay within what the mean can take: 0.5 + 0.57 is cut at a gain of 1, and
    # the rates 0.25 ± 0.49 and 0.75 ± 0.49 at 0 and 1.
    assert 0.5 + half > 1 and result.gain.per_episode.high == 1.0
    assert (result.after_bc.per_episode.low, result.after_rl.per_episode.high) == (0.0, 1.0)
    pooled = heldout.compare([(before, after), ({"a": 1.0}, {"a": 0.0})])  # a second seed
    assert pooled.gain.n == 5 and pooled.gain.mean == pytest.approx(0.2)


def test_the_guard_warns_on_entropy_collapse_and_climbing_invalid_actions() -> None:
    guard = CollapseGuard(entropy_floor=0.05, invalid_rise=0.2)
    assert guard.check({"phase": "bc", "loss": 0.1}) == []
    assert guard.check({"phase": "rl", "step": 1, "entropy": 0.8, "invalid_share": 0.1}) == []
    assert guard.check({"phase": "rl", "step": 2, "entropy": 0.6, "invalid_share": 0.25}) == []
    (collapse, climbing) = guard.check({"phase": "rl", "step": 3, "entropy": 0.01, "invalid_share": 0.4})
    assert "entropy collapse" in collapse and "invalid actions climbing" in climbing


ONE_RL_STEP = {
    "env": "choice",
    "steps": 1,
    "tasks_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 4,
    "agent_format": "plain",
    "eval_tasks": 4,
}
"""A tiny run on ``choice``: one RL step of 2 tasks × 2 episodes, 4 held-out tasks."""


def test_a_run_evaluates_after_behaviour_cloning_and_at_the_end(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    settings = ONE_RL_STEP | {
        "env_url": choice_url,
        "bc_steps": 2,
        "bc_episodes": 4,
        "entropy_floor": 100.0,  # any entropy is "collapsed": the warning must reach the record
        # Keeps every episode in the update, so the step has an entropy reading even when
        # its groups all scored alike (no advantage: no reading, no warning; a flake under load).
        "entropy_coef": 1e-4,
        "learning_rate": 1e-3,
        "rl_learning_rate": 2e-4,
    }
    result = train_grpo(tiny_model_dir, tmp_path, settings)
    history = run_metrics(tmp_path)
    for step, lr in ((2, 1e-3), (3, 2e-4)):  # cloning at learning_rate, RL at rl_learning_rate
        saved = torch.load(tmp_path / "checkpoints" / f"step-{step:06d}" / "optimizer.pt", weights_only=False)
        assert saved["optimizer"]["param_groups"][0]["lr"] == pytest.approx(lr)
    evaluated = [(r["step"], r["phase"], len(r["eval_outcomes"])) for r in history if "eval_outcomes" in r]
    assert evaluated == [(2, "bc", 4), (3, "rl", 4)]
    assert "entropy collapse" in history[-1]["warnings"][0]
    assert "invalid_share" in history[-1] and "eval_invalid_share" in history[-1]
    saved = (tmp_path / heldout.BEFORE_AFTER_FILE).read_text()
    assert '"gain"' in saved and "held-out success after behaviour cloning" in result.output
    assert f"manifest{tmp_path / 'manifest.json'}" in "".join(result.output.split())  # rich may fold it
    for step in (2, 3):  # the evaluated episodes are kept, one file per evaluation
        kept = read_trajectories(tmp_path / "rollouts" / "eval" / f"step-{step:06d}.jsonl")
        assert sorted(t.task_id for t in kept) == sorted(history[step - 1]["eval_outcomes"])


def test_a_run_without_cloning_compares_with_the_untrained_policy_evaluated_once(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    result = train_grpo(tiny_model_dir, tmp_path, ONE_RL_STEP | {"env_url": choice_url, "bc_steps": 0})
    metrics = tmp_path / "metrics.jsonl"
    records = all_records(tmp_path)
    assert [(r["step"], r["phase"], len(r.get("eval_outcomes", {}))) for r in records] == [
        (0, "start", 4),
        (1, "rl", 4),
    ]
    assert "held-out success before RL (untrained)" in result.output
    # Killed after that evaluation, before the first checkpoint: the resumed run keeps it
    # and does not evaluate again.
    evaluation = metrics.read_text().splitlines()[0]
    shutil.rmtree(tmp_path / "checkpoints")
    metrics.write_text(evaluation + "\n")
    resumed = CliRunner().invoke(app, ["train", "--resume", "--out", str(tmp_path)])
    assert resumed.exit_code == 0, resumed.output
    lines = metrics.read_text().splitlines()
    assert lines[0] == evaluation and [json.loads(line)["step"] for line in lines] == [0, 1]


CURRICULUM_RUN = {
    "bc_steps": 1,
    "bc_episodes": 12,
    "tasks_per_step": 3,
    "group_size": 1,
    "minibatch_size": 1,
    "micro_batch_size": 1,
    "max_turns": 2,
    "max_new_tokens": 4,
    "eval_tasks": 1,
}
"""A tiny run whose RL steps each draw 3 tasks, one episode each, at a horizon of 2."""


@pytest.mark.parametrize("curriculum", ["fits-horizon", "all"])
def test_rl_draws_only_tasks_the_expert_finishes_within_the_horizon(
    curriculum: str, tiny_model_dir: Path, textworld_url: str, tmp_path: Path
) -> None:
    settings = {
        **CURRICULUM_RUN,
        "env_url": textworld_url,
        "curriculum": curriculum,
        "steps": 2,
        "bc_max_tokens": 600,  # too short to clone some demonstrations: RL may still draw their tasks
    }
    train_grpo(tiny_model_dir, tmp_path, settings)
    expert = read_trajectories(tmp_path / "expert.jsonl")
    assert any(len(t.token_ids) > 600 for t in expert) and any(len(t.token_ids) <= 600 for t in expert)
    expert_turns = {t.task_id: t.turns for t in expert}
    assert min(expert_turns.values()) <= 2 < max(expert_turns.values())  # the demonstrations differ in length
    train_order = asyncio.run(list_tasks(textworld_url, "train", None))
    # In task order, not the order the episodes ended in: cloning draws its minibatches from it.
    assert [t.task_id for t in expert] == [task for task in train_order if task in expert_turns]
    # fits-horizon: the expert plays every train task (RL may draw beyond the 12 cloned).
    assert (len(expert_turns) > 12) == (curriculum == "fits-horizon")
    drawn = [
        t.task_id
        for step in (2, 3)
        for t in read_trajectories(tmp_path / "rollouts" / f"step-{step:06d}.jsonl")
    ]
    fits = [expert_turns.get(task, 99) <= 2 for task in drawn]
    assert drawn
    assert all(fits) if curriculum == "fits-horizon" else not all(fits)


def test_unsolved_curriculum_draws_the_tasks_the_policy_lost_at_the_start_of_rl(
    tiny_model_dir: Path, textworld_url: str, tmp_path: Path
) -> None:
    settings = {**CURRICULUM_RUN, "env_url": textworld_url, "curriculum": "unsolved", "steps": 1}
    train_grpo(tiny_model_dir, tmp_path, settings)
    fitting = {t.task_id for t in read_trajectories(tmp_path / "expert.jsonl") if t.turns <= 2}
    frontier = tmp_path / "rollouts" / "frontier" / "step-000002.jsonl"
    played = read_trajectories(frontier)  # one greedy episode per task RL may draw
    assert sorted(t.task_id for t in played) == sorted(fitting) and len(fitting) > 3

    # Mark all but one task as won in that pass: a resumed run must read the pass, not replay
    # it, and draw only the task left.
    left = sorted(fitting)[0]
    lines = [json.loads(line) for line in frontier.read_text().splitlines()]
    for record in lines:
        record["success"] = record["task_id"] != left
    frontier.write_text("".join(json.dumps(record) + "\n" for record in lines))
    config = tmp_path / "config.yaml"
    config.write_text(re.sub(r"(?m)^steps: 1$", "steps: 2", config.read_text()))  # one more RL step
    result = CliRunner().invoke(app, ["train", "--out", str(tmp_path), "--resume"])
    assert result.exit_code == 0, result.output
    drawn = {t.task_id for t in read_trajectories(tmp_path / "rollouts" / "step-000003.jsonl")}
    assert drawn == {left}
    assert len(list(frontier.parent.iterdir())) == 1
