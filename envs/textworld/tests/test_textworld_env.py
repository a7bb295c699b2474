"""TextWorldEnv on real generated games (no mocks): expert play, determinism, splits,
turn limits, errors, the shared game cache and its scheduling, and resource hygiene."""

from __future__ import annotations

import gc
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("textworld")

from textworld.generator.game import Game

from agentgym.contract.errors import EpisodeOver, InvalidAction, UnknownTask
from agentgym.envs.textworld import TextWorldEnv
from agentgym.envs.textworld.env import clean_feedback
from agentgym.envs.textworld.tasks import TEST_SEED_OFFSET

# Jericho warns on every load of a TextWorld game; the env filters it, pytest re-enables it.
pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")

CHALLENGES = ["tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking"]
SMALL = {"n_train": 4, "n_test": 4}  # one task per challenge per split


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory):
    """A cache folder whose 8 small-config games are generated up front, two at a time."""
    root = tmp_path_factory.mktemp("tw-cache")
    env = TextWorldEnv(cache_dir=root, workers=2, **SMALL)
    env.warm_up()
    deadline = time.monotonic() + 120
    while env.store.pending() and time.monotonic() < deadline:
        time.sleep(0.2)
    yield root
    env.store.shutdown()


def make_env(cache: Path, **config) -> TextWorldEnv:
    return TextWorldEnv(cache_dir=cache, **{**SMALL, **config})


def task_of(env: TextWorldEnv, challenge: str, split: str = "train") -> str:
    return next(t.task_id for t in env.tasks(split) if t.meta["challenge"] == challenge)


def run_expert(env: TextWorldEnv, task_id: str) -> tuple[str, list[str], list[float], dict, bool]:
    first, info = env.reset(task_id=task_id)
    actions, rewards, terminated = [], [], False
    while not env.done:
        action = env.expert_action()
        assert action is not None and action in info["available_actions"]
        _, reward, terminated, _, info = env.step(action)
        actions.append(action)
        rewards.append(reward)
    assert env.expert_action() is None
    return first, actions, rewards, info, terminated


def objective(env: TextWorldEnv, task_id: str) -> str:
    return Game.load(str(env.store.path(task_id).with_suffix(".json"))).objective


@pytest.mark.parametrize("challenge", CHALLENGES)
def test_expert_solves_every_challenge(cache: Path, challenge: str) -> None:
    env = make_env(cache)
    task_id = task_of(env, challenge)
    first, actions, rewards, info, terminated = run_expert(env, task_id)
    assert objective(env, task_id) in first
    assert "$$$$" not in first  # the ASCII banner is dropped
    assert terminated and info["success"] and not info["truncated"]
    assert sum(rewards) == pytest.approx(1.0)
    assert info["score"] == pytest.approx(1.0)
    assert 1 <= len(actions) <= 15
    assert "RESTART" not in env.last_observation
    env.close()


@pytest.mark.parametrize("challenge", CHALLENGES)
def test_generation_is_deterministic(cache: Path, challenge: str) -> None:
    """Same task id -> same game, also when regenerated from scratch (the worker that
    regenerates it has generated other games since, and for tw-cooking set order used to
    depend on the hash seed)."""
    env = make_env(cache)
    task_id = task_of(env, challenge, "test")
    before = run_expert(env, task_id)[:2]
    game_bytes = env.store.path(task_id).read_bytes()
    shutil.rmtree(env.store.path(task_id).parent)
    generated = env.store.generated
    assert run_expert(env, task_id)[:2] == before
    assert env.store.generated == generated + 1
    assert env.store.path(task_id).read_bytes() == game_bytes  # the very same story file
    env.close()


def test_expert_recovers_after_a_detour(cache: Path) -> None:
    env = make_env(cache, settings={"tw-coin_collector": [{"level": 3}]})
    _, info = env.reset(task_id=task_of(env, "tw-coin_collector"))
    first = env.expert_action()
    assert first is not None and first.startswith("go ")
    env.step(first)
    back = {"north": "south", "south": "north", "east": "west", "west": "east"}
    env.step("go " + back[first.removeprefix("go ")])  # walk back: off the walkthrough
    assert env.expert_action() == first
    while not env.done:
        *_, info = env.step(env.expert_action())
    assert info["success"]
    env.close()


def test_task_lists_ids_and_splits() -> None:
    env = TextWorldEnv(cache_dir="/nonexistent-never-generated")
    assert env.splits() == {"train": 32, "test": 32, "validation": 32, "ood": 32}
    train, test = env.tasks("train"), env.tasks("test")
    # Ids are part of the public contract: pin the first few.
    assert [t.task_id for t in train[:5]] == [
        "tw-coin_collector/level1/s0",
        "tw-treasure_hunter/level1/s1",
        "tw-simple/dense-detailed/s2",
        "tw-cooking/recipe1-take1-go1/s3",
        "tw-coin_collector/level2/s4",
    ]
    assert test[0].task_id == f"tw-coin_collector/level1/s{TEST_SEED_OFFSET}"
    assert {t.meta["seed"] for t in train}.isdisjoint(t.meta["seed"] for t in test)
    assert len({t.task_id for t in train + test}) == 64
    assert {t.meta["challenge"] for t in train} == set(CHALLENGES)
    assert train[3].meta["settings"]["split"] == "train"
    assert test[3].meta["settings"]["split"] == "test"
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*", t.task_id) for t in train + test)
    # Growing a split only appends tasks.
    assert TextWorldEnv(cache_dir="/nonexistent", n_train=8).tasks("train") == train[:8]
    with pytest.raises(UnknownTask):
        env.tasks("valid")


def test_settings_knobs_are_validated() -> None:
    env = TextWorldEnv(
        cache_dir="/nonexistent",
        challenges=("tw-cooking",),
        settings={"tw-cooking": [{"recipe": 2, "take": 2, "go": 6, "open": True}]},
        n_train=1,
        n_test=0,
    )
    assert env.tasks("train")[0].task_id == "tw-cooking/recipe2-take2-go6-open/s0"
    for bad in (
        {"tw-cooking": [{"recipes": 2}]},
        {"tw-cooking": [{"go": 5}]},
        {"tw-cooking": [{"recipe": 1, "take": 2}]},
        {"tw-simple": [{"rewards": "dense", "goal": "none"}]},
        {"tw-coin_collector": [{"level": 0}]},
    ):
        with pytest.raises(ValueError):
            TextWorldEnv(cache_dir="/nonexistent", challenges=tuple(bad), settings=bad)
    for bad_config in ({"difficulty": "impossible"}, {"challenges": ()}, {"challenges": ("zork",)}):
        with pytest.raises(ValueError):
            TextWorldEnv(cache_dir="/nonexistent", **bad_config)


def test_truncation_and_episode_over(cache: Path) -> None:
    env = make_env(cache)
    env.reset(task_id=task_of(env, "tw-simple"), options={"max_turns": 2})
    *_, terminated, truncated, _ = env.step("look")
    assert not terminated and not truncated
    *_, terminated, truncated, info = env.step("inventory")
    assert truncated and not terminated and info["truncated"]
    with pytest.raises(EpisodeOver):
        env.step("look")
    env.close()


def test_errors(cache: Path) -> None:
    env = make_env(cache)
    with pytest.raises(UnknownTask):
        env.reset(task_id="tw-coin_collector/level1/s999")
    _, info = env.reset(task_id=task_of(env, "tw-coin_collector"))
    assert info["available_actions"] == sorted(info["available_actions"])
    with pytest.raises(InvalidAction):
        env.step("   ")
    observation, reward, *_ = env.step("dance wildly")  # unknown verbs are a normal turn
    assert observation and reward == 0.0
    env.close()


def test_cache_is_reused(cache: Path) -> None:
    env = make_env(cache)
    task_id = task_of(env, "tw-treasure_hunter")
    env.reset(task_id=task_id)
    mtime, generated = env.store.path(task_id).stat().st_mtime_ns, env.store.generated
    other = make_env(cache)
    other.reset(task_id=task_id)
    assert other.store is env.store and env.store.generated == generated
    # A fresh process (its own store) finds the game on disk too.
    script = (
        "import sys; from agentgym.envs.textworld import TextWorldEnv;"
        "env = TextWorldEnv(cache_dir=sys.argv[1], n_train=4, n_test=4);"
        "env.reset(task_id=sys.argv[2]); print(env.store.generated)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(cache), task_id],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "0"
    assert env.store.path(task_id).stat().st_mtime_ns == mtime
    env.close()
    other.close()


def test_same_new_game_from_many_threads_is_generated_once(cache: Path) -> None:
    env = make_env(cache, challenges=("tw-coin_collector",), n_train=6)
    task_id = env.tasks("train")[5].task_id  # not among the pre-generated games
    generated = env.store.generated
    envs = [make_env(cache, challenges=("tw-coin_collector",), n_train=6) for _ in range(4)]
    observations: list[str] = []
    threads = [
        threading.Thread(target=lambda e=e: observations.append(e.reset(task_id=task_id)[0])) for e in envs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(observations) == 4 and len(set(observations)) == 1
    assert env.store.generated == generated + 1
    for e in envs:
        e.close()


def test_concurrent_episodes_in_threads(cache: Path) -> None:
    """Servers reset and step sessions from many threads at once."""
    from textworld.logic import GameLogic

    # Make every thread's first load parse its game logic again: that parser is shared
    # by the whole process and is what concurrent loads used to crash in.
    GameLogic.parse.__func__.cache_clear()
    task_ids = [task_of(make_env(cache), c) for c in CHALLENGES] * 2
    results: list[bool] = []

    def play(task_id: str) -> None:
        env = make_env(cache)
        *_, info, _ = run_expert(env, task_id)
        results.append(info["success"])
        env.close()

    threads = [threading.Thread(target=play, args=(task_id,)) for task_id in task_ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert results == [True] * len(task_ids)


def test_on_demand_game_jumps_the_prefetch_queue(tmp_path: Path) -> None:
    env = TextWorldEnv(cache_dir=tmp_path, n_train=40, n_test=20, workers=1)
    try:
        env.warm_up()
        assert env.store.generated == 0  # warm_up queues the games and returns at once
        last = env.tasks("test")[-1].task_id  # last in the prefetch order
        env.reset(task_id=last)
        # The reset waited for one game the worker was busy with plus its own, not 60 games.
        assert env.store.pending() > 40
        assert env.store.generated <= 3
    finally:
        env.close()
        env.store.shutdown()
    assert not list((env.store.root / ".tmp").glob("gen-*"))  # an interrupted game left nothing


def test_close_is_idempotent_and_nothing_leaks(cache: Path) -> None:
    import psutil

    task_id = task_of(make_env(cache), "tw-cooking")
    env = make_env(cache)
    env.close()  # before any reset
    env.reset(task_id=task_id)
    env.close()
    env.close()

    def cycle() -> None:
        e = make_env(cache)
        e.reset(task_id=task_id)
        e.step(e.expert_action() or "look")
        e.close()

    def engines_loaded() -> int:  # jericho maps a private copy of libfrotz per game
        return Path("/proc/self/maps").read_text().count("libfrotz")

    cycle()
    gc.collect()  # count only this test's fds, not garbage other tests left (e.g. sockets)
    process = psutil.Process()
    fds, rss, engines = len(os.listdir("/proc/self/fd")), process.memory_info().rss, engines_loaded()
    for _ in range(100):
        cycle()
    assert len(os.listdir("/proc/self/fd")) <= fds
    assert engines_loaded() <= engines
    assert process.memory_info().rss - rss < 64 * 2**20


def test_clean_feedback_strips_prompt_and_menus() -> None:
    raw = "You take the coin.\n\n\n\nYour score has just gone up by one point.\n>  -= Bedroom =-0/1  "
    assert clean_feedback(raw) == "You take the coin.\n\nYour score has just gone up by one point."
    end = "Done.\n\n *** The End ***\n\nWould you like to RESTART, RESTORE a saved game, QUIT?"
    assert clean_feedback(end) == "Done.\n\n *** The End ***"
    assert clean_feedback(">") == ""
