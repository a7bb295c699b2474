"""Issue 21 items 4 and 6 through the CLI a user types: one port scheme shared by `serve`,
`up`, `envs` and the Gymnasium adapter, ports bound before they are announced, local
servers of `eval` on free ports; examples in every `--help`, `train --print-config`,
shipped recipes, and `--set` keys checked against the valid ones.

The port scheme is the documented one (docs/deployment.md): the base port (8100,
`$AGENTGYM_BASE_PORT`, `up --base-port`) plus a fixed offset per env, choice +5. Tests
never bind fixed ports: they put the base where a free port lands on the env they use."""

from __future__ import annotations

import io
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import metadata
from pathlib import Path

import gymnasium
import httpx
import psutil
import pytest
import yaml
from rich.console import Console
from rich.progress import Progress
from typer.testing import CliRunner

import agentgym.cli.display as cli_module
import agentgym.clients.gym_adapter  # noqa: F401 - registers agentgym/<name>-v0
from agentgym import registry
from agentgym.cli import app
from agentgym.envs.choice import ChoiceEnv
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import free_port, serve_in_thread
from agentgym.trainers.config import TrainConfig
from agentgym.trainers.config_files import ENV_LAYER, ENVS_DIR
from agentgym.trainers.presets import PRESETS
from conftest import read_until, stop_with_ctrl_c

runner = CliRunner()
CHOICE_OFFSET = 5
"""choice's offset in the documented port scheme."""
CHOICE_SCHEME_PORT = 8100 + CHOICE_OFFSET


def run_cli(args: list[str], **env: str) -> subprocess.Popen:
    """``agentgym ARGS`` as a user runs it, output readable line by line."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200", **env},
    )


def answers(url: str, timeout: float = 120.0) -> dict | None:
    """``url/health``'s JSON once it answers, None if it never does within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return httpx.get(f"{url}/health", timeout=2.0).json()
        except httpx.TransportError:
            time.sleep(0.2)
    return None


@contextmanager
def held_port() -> Iterator[int]:
    """A port another process holds (a bare listening socket that never answers)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# ----- one port story (item 4) ---------------------------------------------------------------


def test_serve_envs_and_the_gym_adapter_agree_on_the_default_port(monkeypatch) -> None:
    port = free_port()
    base = str(port - CHOICE_OFFSET)
    monkeypatch.setenv("AGENTGYM_BASE_PORT", base)
    server = run_cli(["serve", "choice", "--log-level", "warning"], AGENTGYM_BASE_PORT=base)
    try:
        health = answers(f"http://127.0.0.1:{port}", timeout=60)
        assert health is not None and health["env"] == "choice", "serve did not listen on choice's port"
        listed = runner.invoke(app, ["envs"], env={"COLUMNS": "200"})
        row = next(line for line in listed.output.splitlines() if "choice" in line)
        assert f"http://127.0.0.1:{port}" in row and "yes" in row, listed.output

        env = gymnasium.make("agentgym/choice-v0")  # no base_url: the scheme's
        try:
            observation, info = env.reset(seed=0)
            assert observation and info["task_id"]
        finally:
            env.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_up_base_port_moves_every_server(tmp_path: Path) -> None:
    port = free_port()
    proc = run_cli(["up", "choice", "--base-port", str(port - CHOICE_OFFSET), "--log-dir", str(tmp_path)])
    try:
        output = read_until(proc, "Ctrl-C", 180)
        assert f"http://127.0.0.1:{port}" in output, output
        assert (answers(f"http://127.0.0.1:{port}", timeout=10) or {}).get("env") == "choice"
        stop_with_ctrl_c(proc, psutil.Process(proc.pid).children(recursive=True), output)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("spec", ["choice", "choice=2"])
def test_up_on_a_taken_port_fails_at_once_naming_it(spec: str, tmp_path: Path) -> None:
    with held_port() as port:
        # choice alone listens on base + 5; with replicas, the gateway listens on the base
        base = port - CHOICE_OFFSET if spec == "choice" else port
        result = runner.invoke(app, ["up", spec, "--base-port", str(base), "--log-dir", str(tmp_path)])
    assert result.exit_code == 1, result.output
    assert f"127.0.0.1:{port}" in result.output and "in use" in result.output, result.output
    assert "--base-port" in result.output  # says how to move out of the way
    assert not list(tmp_path.glob("choice*.log"))  # failed before starting any server


def test_eval_starts_its_local_server_on_a_free_port(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("AGENTGYM_BASE_PORT", raising=False)
    result = runner.invoke(
        app, ["eval", "--env", "choice", "--policy", "expert", "--n", "1", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    log = (tmp_path / "servers" / "choice.log").read_text()
    ports = re.findall(r"http://127\.0\.0\.1:(\d+)", log)  # the server says where it listens
    assert ports, log
    assert CHOICE_SCHEME_PORT not in map(int, ports)  # where `agentgym up` / `serve choice` listen


def test_view_checks_its_port_before_announcing_it(tmp_path: Path) -> None:
    trajectories = tmp_path / "trajectories.jsonl"
    record = {"env": "choice", "task_id": "t", "messages": [{"role": "user", "content": "hi"}], "turns": 1}
    trajectories.write_text(json.dumps(record) + "\n")
    with held_port() as port:
        proc = run_cli(["view", str(trajectories), "--port", str(port), "--no-open"])
        output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, output
    assert f"127.0.0.1:{port}" in output and "in use" in output, output
    assert "viewing" not in output  # no URL announced that nobody serves


# ----- discoverability (item 6) ----------------------------------------------------------------


def cli(args: list[str]):
    return runner.invoke(app, args, env={"COLUMNS": "200"})


def test_every_command_help_shows_an_example() -> None:
    names = [c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands]
    assert {"serve", "up", "eval", "train", "view"} <= set(names)
    for name in names:
        result = cli([name, "--help"])
        assert result.exit_code == 0, (name, result.output)
        example = re.compile(rf"(?m)^\s*(Example:\s*)?agentgym {re.escape(name)}( |$)")
        assert example.search(result.output), f"`agentgym {name} --help` shows no example:\n{result.output}"


def printed_config(args: list[str]) -> tuple[dict, str]:
    result = cli(["train", *args, "--print-config"])
    assert result.exit_code == 0, result.output
    return yaml.safe_load(result.output), result.output


def test_print_config_shows_the_resolved_config_with_each_fields_doc(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [
        "--algo",
        "dapo",
        "--env",
        "choice",
        "--set",
        "steps=7",
        "--set",
        "bapo.rho0=0.5",
        "--out",
        str(run),
    ]
    values, text = printed_config(args)
    assert (values["algo"], values["env"], values["steps"], values["bapo"]["rho0"]) == (
        "dapo",
        "choice",
        7,
        0.5,
    )
    assert values["clip"]["eps_high"] == 0.28 and values["dynamic_sampling"] is True  # DAPO's, filled in
    assert values["output_dir"] == str(run)
    # each field's doc sits above it as a comment, nested fields too
    assert re.search(r"# RL steps \(each: collect a batch of groups, then update\)\.\nsteps: 7\n", text), text
    assert re.search(r"\n  # Target positive share .*\n  rho0: 0.5\n", text), text
    assert TrainConfig.from_dict(values).to_dict() == values  # it loads back as a --config file
    assert not run.exists()  # nothing is created


def shipped_recipes() -> list[str]:
    """The recipe names, as the error for a wrong one lists them."""
    result = cli(["train", "--recipe", "no-such-recipe", "--print-config"])
    assert result.exit_code == 2, result.output
    listed = " ".join(result.output.split()).partition("shipped recipes: ")[2]
    return listed.split(", ")


def test_a_shipped_recipe_for_every_algorithm_and_env_loads() -> None:
    names = shipped_recipes()
    expected = {
        f"{algo}-{env}" for algo in PRESETS if algo != "critique-rl" for env in registry.builtin_names()
    }
    assert expected | {"critique-rl-math"} <= set(names), names
    for name in names:
        values, _ = printed_config(["--recipe", name])
        assert [values["algo"], values["env"]] == name.rsplit("-", 1), name  # env names have no "-"
        TrainConfig.from_dict(values)  # validates


def test_recipe_values_give_way_to_flags_and_set() -> None:
    values, _ = printed_config(["--recipe", "grpo-choice"])
    assert (values["agent_format"], values["schedule"], values["bc_steps"]) == ("plain", "fixed", 0)


def test_an_env_brings_its_own_layer_under_everything_else(tmp_path: Path) -> None:
    """``--env search`` (or ``env`` set in a file or by ``--set``) starts from search's
    layer, not textworld's defaults; anything given explicitly still wins."""
    shipped = yaml.safe_load((ENVS_DIR / "search" / ENV_LAYER).read_text())
    config = tmp_path / "mine.yaml"
    config.write_text("env: search\n")
    for args in (["--env", "search"], ["--set", "env=search"], ["--config", str(config)]):
        values, _ = printed_config(args)
        assert (values["max_new_tokens"], values["rounds"]) == (shipped["max_new_tokens"], shipped["rounds"])
        assert values["max_new_tokens"] != TrainConfig().max_new_tokens, "the test needs a field that differs"
    values, _ = printed_config(["--env", "search", "--set", "max_new_tokens=20"])
    assert (values["max_new_tokens"], values["rounds"]) == (20, shipped["rounds"])
    values, _ = printed_config(["--recipe", "grpo-search", "--env", "choice"])
    assert (values["env"], values["max_new_tokens"], values["rounds"]) == ("choice", 64, shipped["rounds"])

    values, _ = printed_config(["--recipe", "grpo-choice", "--algo", "rloo", "--set", "bc_steps=3"])
    assert (values["algo"], values["agent_format"], values["bc_steps"]) == ("rloo", "plain", 3)


def test_config_file_algo_is_not_overridden_by_the_flags_defaults(tmp_path: Path) -> None:
    config = tmp_path / "mine.yaml"
    config.write_text("algo: grpo\nschedule: fixed\n")
    values, _ = printed_config(["--config", str(config)])
    assert (values["algo"], values["schedule"]) == ("grpo", "fixed")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["train", "--set", "stepz=3"], "did you mean bc_steps, steps?"),  # the ninety keys: the nearest
        (["train", "--env", "choice", "--set", "env_settings.bogus=1"], "n_train"),  # an env's few: all
        (["serve", "textworld", "--set", "bogus_key=1"], "challenges"),
    ],
)
def test_an_unknown_set_key_exits_2_naming_the_nearest_or_the_valid_ones(
    args: list[str], named: str, tmp_path: Path
) -> None:
    result = cli([*args, "--out", str(tmp_path / "run")] if args[0] == "train" else args)
    assert result.exit_code == 2, result.output
    assert named in " ".join(result.output.split()), result.output
    assert "Traceback" not in result.output and not isinstance(result.exception, TypeError)
    assert not (tmp_path / "run").exists()


def test_eval_progress_shows_an_eta_after_one_slow_episode() -> None:
    """Issue 21 item 2: rich's estimate needs two episodes within 30 s; an eval whose
    episodes take minutes showed -:--:-- throughout."""
    eta = getattr(cli_module, "EtaColumn", None)
    assert eta is not None, "the eval progress bar has no ETA of its own"
    terminal = Console(file=io.StringIO(), force_terminal=True)  # a pipe gets plain lines instead
    assert any(isinstance(c, eta) for c in cli_module.episode_progress(terminal)[0].columns)
    clock = [0.0]
    progress = Progress(eta(), get_time=lambda: clock[0], console=Console(file=io.StringIO()))
    bar = progress.add_task("episodes", total=10, completed=2, resumed=2)  # a resumed eval found 2 done
    clock[0] = 120.0  # its first episode took two minutes
    progress.advance(bar)
    assert eta().render(progress.tasks[0]).plain == "eta 0:14:00"  # 7 left at 120 s each


@pytest.mark.parametrize(
    ("args", "hint"),
    [
        (["eval", "--env", "textwrld"], "unknown environment 'textwrld' (did you mean textworld?)"),
        (["train", "--recipe", "bapo-textwrld", "--print-config"], "(did you mean bapo-textworld,"),
        (["train", "--algo", "bapp", "--print-config"], "unknown algo 'bapp' (did you mean bapo?)"),
        (
            ["train", "--set", "stepz=3", "--print-config"],
            "unknown config key stepz (did you mean bc_steps, steps?)",
        ),
    ],
)
def test_a_typo_gets_the_nearest_names_not_every_name(args: list[str], hint: str) -> None:
    result = cli(args)
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and hint in said, said
    assert "wandb_project" not in said  # not the ninety config keys


def test_version() -> None:
    result = cli(["--version"])
    assert (
        result.exit_code == 0 and result.output.strip() == f"agentgym {metadata.version('agentgym-platform')}"
    )


class SplitlessChoice(ChoiceEnv):
    """``choice`` with a test split only (as the docs' ``echo`` plugin has)."""

    def __init__(self, **settings: object) -> None:
        super().__init__(**settings)
        self._tasks = {"test": self._tasks["test"]}


def test_training_on_an_env_without_a_train_split_exits_2_naming_its_splits(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    registry.register("test-split-only", SplitlessChoice)
    try:
        with serve_in_thread(ServerConfig(env="test-split-only")) as url:
            args = ["--model", str(tiny_model_dir), "--out", str(tmp_path / "run")]
            result = cli(["train", *args, "--set", "env=test-split-only", "--set", f"env_url={url}"])
    finally:
        registry.unregister("test-split-only")
    said = " ".join(result.output.split())
    assert result.exit_code == 2, said
    assert "env 'test-split-only' has no train tasks (its splits: {'test': 32})" in said
    assert "Traceback" not in said
