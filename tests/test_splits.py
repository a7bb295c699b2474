"""Every built-in env has three disjoint splits (train, validation, test); the test lists
are frozen (``tests/data/splits_before.json`` was computed before validation existed);
ScienceWorld's ``dev`` still names validation; and the trainer's choices (``eval_every``,
the best checkpoint) read validation only, while the test panel is played just before and
after, at a turn limit fixed per env."""

from __future__ import annotations

import hashlib
import itertools
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import yaml
from typer.testing import CliRunner

from agentgym import registry
from agentgym.cli import app
from agentgym.contract.core import TextEnv
from agentgym.records.run_folder import RunDir
from agentgym.records.trajectory import read_trajectories
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.config_files import ENV_LAYER, ENVS_DIR, env_layer
from conftest import all_records

BEFORE = json.loads((Path(__file__).parent / "data" / "splits_before.json").read_text())
SPLITS = ("train", "validation", "test")
SCIWORLD = {"heap_mb": 256, "max_jvms": 2, "spare_jvms": 0, "max_idle_jvms": 0}
CHEAP: dict[str, dict[str, Any]] = {
    "textworld": {"prefetch": False, "n_train": 400, "n_test": 400},
    "choice": {"n_train": 300, "n_test": 300},
    "math": {"n_train": 300, "n_test": 300},
    "webshop": {"n_products": 1000, "n_train": 300, "n_test": 300},
    "search": {},  # its defaults: 500 train, 100 test questions
    "sciworld": SCIWORLD,  # every variation of every task type
}
"""Built-in envs whose defaults hold few tasks per split, or generate games when listed:
settings with many tasks (validation: its default size) and no game generated. Every
other built-in env is checked with its defaults."""


def make(name: str) -> TextEnv:
    return registry.make(name, **CHEAP.get(name, {}))


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def generation_seeds(name: str, env: TextEnv, split: str) -> set[Any]:
    """What generates each task of ``split``: its seed, or its id where no seed names a task
    alone (a ScienceWorld variation; a BabyAI level and seed)."""
    tasks = env.tasks(split)
    if name == "math":
        from agentgym.envs.math.env import SPLIT_SEEDS
    elif name == "webshop":
        from agentgym.envs.webshop.goals import SPLIT_SEEDS
    else:
        seeds = [t.meta.get("seed") for t in tasks]
        return (
            set(seeds) if None not in seeds and len(set(seeds)) == len(seeds) else {t.task_id for t in tasks}
        )
    return {SPLIT_SEEDS[t.split] + index for index, t in enumerate(tasks)}


@pytest.mark.parametrize("name", registry.builtin_names())
def test_train_validation_and_test_share_no_task_id_and_no_seed(name: str, agentgym_cache: str) -> None:
    env = make(name)
    assert set(SPLITS) <= set(env.splits()), env.splits()
    assert all(env.splits()[split] > 0 for split in SPLITS)
    ids = {split: [t.task_id for t in env.tasks(split)] for split in SPLITS}
    seeds = {split: generation_seeds(name, env, split) for split in SPLITS}
    for split in SPLITS:
        assert all(t.split == split for t in env.tasks(split))
        assert len(set(ids[split])) == len(ids[split]) == len(seeds[split])
    for one, other in itertools.combinations(SPLITS, 2):
        assert not set(ids[one]) & set(ids[other]), (one, other)
        assert not seeds[one] & seeds[other], (one, other)
        assert all(env.task(task_id).split == one for task_id in ids[one][:50])


def test_what_validation_draws_from(agentgym_cache: str) -> None:
    """Validation games, goals and questions come from where the env docs say: never from
    what test holds back (test's foods, products, start entities) nor train's own tasks."""
    textworld = make("textworld")
    assert "validation" in textworld.splits()
    for task in textworld.tasks("validation"):
        settings = task.meta["settings"]
        if task.meta["challenge"] == "tw-cooking":
            assert settings["split"] == "valid"  # TextWorld's validation foods and preparations
        if task.meta["challenge"] == "tw-simple":
            assert settings["test"] is False  # only a train and a test distribution
    webshop = make("webshop")
    asins = {s: {webshop.world.goal(s, i).asin for i in range(webshop.splits()[s])} for s in SPLITS}
    assert not asins["test"] & (asins["train"] | asins["validation"])
    search = make("search")
    questions = {s: {search.library.questions[t.task_id].question for t in search.tasks(s)} for s in SPLITS}
    for one, other in itertools.combinations(SPLITS, 2):
        assert not questions[one] & questions[other], (one, other)


def test_test_lists_stay_as_they_were_and_train_ids_keep_their_meaning(agentgym_cache: str) -> None:
    textworld = registry.make("textworld", prefetch=False)  # the defaults: the 32 frozen test tasks
    assert [t.to_dict() for t in textworld.tasks("test")] == BEFORE["textworld_test"]
    assert [t.to_dict() for t in textworld.tasks("train")[:16]] == BEFORE["textworld_train"]
    choice, math = registry.make("choice"), registry.make("math")
    webshop, search = registry.make("webshop"), registry.make("search")
    for split in ("train", "test"):
        assert [[t.task_id, t.meta["options"]] for t in choice.tasks(split)[:8]] == BEFORE[f"choice_{split}"]
        listed = [[t.task_id, digest(math.problem(t.task_id).question)] for t in math.tasks(split)[:16]]
        assert listed == BEFORE[f"math_{split}"]
        listed = [[t.task_id, digest(t.meta["instruction"])] for t in webshop.tasks(split)[:16]]
        assert listed == BEFORE[f"webshop_{split}"]
        questions = search.library.questions
        listed = [[t.task_id, digest(questions[t.task_id].question)] for t in search.tasks(split)[:16]]
        assert listed == BEFORE[f"search_{split}"]
    sciworld = registry.make("sciworld", **SCIWORLD)
    for split in ("train", "dev", "test"):
        assert [t.task_id for t in sciworld.tasks(split)[:16]] == BEFORE[f"sciworld_{split}"]


def test_no_split_can_grow_into_the_next_ones_seeds(agentgym_cache: str) -> None:
    from agentgym.envs.textworld.tasks import DIFFICULTIES, build_tasks

    for name in ("textworld", "choice"):  # validation seeds lie between train's and test's
        env = make(name)
        assert "validation" in env.splits(), name
        seeds = generation_seeds(name, env, "validation")
        assert seeds and all(500_000 <= seed < 1_000_000 for seed in seeds), name
    variants = {"tw-coin_collector": DIFFICULTIES["easy"]["tw-coin_collector"]}
    with pytest.raises(ValueError, match="a split holds 0 to 500000 tasks"):
        build_tasks("train", 500_001, variants)
    with pytest.raises(ValueError, match="a split holds 0 to 500000 tasks"):
        registry.make("choice", n_train=500_001)


def test_dev_names_sciworld_validation_on_the_wire_and_in_the_cli(
    choice_url: str, agentgym_cache: str, tmp_path: Path
) -> None:
    sciworld = registry.make("sciworld", **SCIWORLD)
    assert list(sciworld.splits()) == ["train", "validation", "test"]
    assert sciworld.tasks("dev") == sciworld.tasks("validation")
    assert [t.task_id for t in sciworld.tasks("validation")[:16]] == BEFORE["sciworld_dev"]
    assert sciworld.task("boil/14").split == "validation"  # ScienceWorld's first dev variation of boil
    config = ServerConfig(env="sciworld", env_config=SCIWORLD, warm=0, engine_workers=0)
    with serve_in_thread(config) as url, httpx.Client(base_url=url) as http:
        assert http.get("/metadata").json()["splits"] == sciworld.splits()
        listed = http.get("/tasks", params={"split": "dev", "limit": 5}).json()
        assert listed["total"] == sciworld.splits()["validation"]
        assert [t["task_id"] for t in listed["tasks"]] == BEFORE["sciworld_dev"][:5]
    with httpx.Client(base_url=choice_url) as http:  # a reset names it too (any env with validation)
        created = http.post("/sessions", json={"split": "dev", "index": 1})
        assert created.status_code == 201, created.text
        assert created.json()["info"]["task_id"] == "choice/validation/1"
        http.delete(f"/sessions/{created.json()['session_id']}")
    args = [
        "eval",
        "--env",
        "choice",
        "--url",
        choice_url,
        "--policy",
        "expert",
        "--split",
        "dev",
        "--n",
        "2",
    ]
    result = CliRunner().invoke(app, [*args, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    played = sorted(t.task_id for t in read_trajectories(tmp_path / "trajectories.jsonl"))
    assert played == ["choice/validation/0", "choice/validation/1"]


# ----- the trainer -------------------------------------------------------------------------


def test_the_eval_turn_limit_is_fixed_per_env_not_by_the_schedule() -> None:
    layer = env_layer("textworld")
    shipped = TrainConfig.from_dict(layer)
    assert shipped.rounds == [4, 6, 8] and shipped.eval_horizon == 8  # today's figures: 8 turns
    for overrides in ({"rounds": [2, 4]}, {"rounds": [4, 6, 8, 12]}, {"schedule": "fixed", "max_turns": 3}):
        assert shipped.with_overrides(overrides).eval_horizon == 8, overrides
    for path in sorted(ENVS_DIR.glob(f"*/{ENV_LAYER}")):  # every env fixes its own
        values = yaml.safe_load(path.read_text())
        config = TrainConfig.from_dict(values)
        assert isinstance(values.get("eval_max_turns"), int), path.parent.name
        assert (
            config.with_overrides({"rounds": [1, 2], "schedule": "scaling-inter"}).eval_horizon
            == (values["eval_max_turns"])
        )


def test_the_best_checkpoint_is_chosen_by_validation_never_by_the_test_panel(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    records = {
        1: {"phase": "bc", "eval_success_rate": 1.0, "val_success_rate": 0.1},  # test panel: best, ignored
        2: {"phase": "rl", "val_success_rate": 0.7},
        3: {"phase": "rl", "val_success_rate": 0.2},
        4: {"phase": "rl", "eval_success_rate": 0.9, "val_success_rate": 0.3},
    }
    for step, record in records.items():
        with open(run.metrics_path, "a") as fh:
            fh.write(json.dumps({"step": step, **record}) + "\n")
        run.save_checkpoint(step, model, optimizer, {}, keep=1)
    assert run.best_step() == 2
    assert sorted(p.name for p in run.checkpoints.glob("step-*")) == ["step-000002", "step-000004"]


def test_a_run_validates_when_choosing_and_plays_the_test_panel_only_before_and_after(
    tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    settings = {
        "env_url": choice_url,
        "env": "choice",
        "bc_steps": 1,
        "bc_episodes": 4,
        "steps": 3,
        "eval_every": 2,
        "eval_tasks": 4,
        "tasks_per_step": 2,
        "group_size": 2,
        "max_new_tokens": 4,
        "agent_format": "plain",
    }
    args = [
        "train",
        "--algo",
        "grpo",
        "--schedule",
        "fixed",
        "--model",
        str(tiny_model_dir),
        "--out",
        str(tmp_path),
    ]
    result = CliRunner().invoke(app, args + [f"--set={k}={v}" for k, v in settings.items()])
    assert result.exit_code == 0, result.output
    records = all_records(tmp_path)
    with httpx.Client(base_url=choice_url) as http:
        test = sorted(
            t["task_id"] for t in http.get("/tasks", params={"split": "test", "limit": 4}).json()["tasks"]
        )
        # The first val_tasks (default 32) of the validation split.
        listed = http.get("/tasks", params={"split": "validation", "limit": 32}).json()
    tested = [(r["step"], sorted(r["eval_outcomes"])) for r in records if "eval_outcomes" in r]
    validated = [(r["step"], sorted(r["val_outcomes"])) for r in records if "val_outcomes" in r]
    # The test panel: after cloning (the "before") and at the end (the "after"), nowhere else.
    assert tested == [(1, test), (4, test)]
    # Validation: after cloning, every eval_every RL steps, and at the end; its own tasks.
    validation = sorted(t["task_id"] for t in listed["tasks"])
    assert validated == [(1, validation), (3, validation), (4, validation)]
    assert len(validation) == TrainConfig().val_tasks
    assert all("val_success_rate" in r for r in records if "val_outcomes" in r)
    kept = sorted((tmp_path / "rollouts").glob("*/step-*.jsonl"))
    steps = {
        folder: [int(p.stem.removeprefix("step-")) for p in kept if p.parent.name == folder]
        for folder in ("eval", "validation")
    }
    assert steps == {"eval": [1, 4], "validation": [1, 3, 4]}
    before_after = json.loads((tmp_path / "heldout.json").read_text())
    assert before_after["tasks"] == test


def test_textworld_ood_is_the_next_difficulty_on_held_out_seeds_and_frozen(agentgym_cache: str) -> None:
    """The out-of-distribution panel: settings the default (easy) run never trains on, from
    TextWorld's held-out distributions, on seeds of its own, the same list forever."""
    from agentgym.envs.textworld.tasks import DIFFICULTIES

    textworld = registry.make("textworld", prefetch=False)
    ood = textworld.tasks("ood")
    frozen = json.loads((Path(__file__).parent / "data" / "textworld_ood.json").read_text())["tasks"]
    assert [t.to_dict() for t in ood] == frozen and len(ood) == 32
    trained = {
        t.task_id.rsplit("/", 1)[0] for split in ("train", "validation") for t in textworld.tasks(split)
    }
    for task in ood:
        challenge, settings = task.meta["challenge"], task.meta["settings"]
        assert task.task_id.rsplit("/", 1)[0] not in trained
        assert any(variant.items() <= settings.items() for variant in DIFFICULTIES["medium"][challenge])
        assert task.meta["seed"] >= 1_500_000
        assert settings.get("split", "test") == "test" and settings.get("test", True) is True
    assert "ood" not in registry.make("textworld", difficulty="hard", prefetch=False).splits()
