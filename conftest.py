"""Shared fixtures for every test (tests/ and each env's envs/NAME/tests): a per-run cache
folder and live env servers on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import httpx
import psutil
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

if TYPE_CHECKING:
    from agentgym.trainers.config import TrainConfig

# Started in the background of a non-interactive shell (`make test &`), pytest inherits
# SIGINT ignored, and so would every CLI the tests stop with Ctrl-C. A handler of our own
# is reset to the default in each child, so the children get Python's Ctrl-C back.
signal.signal(signal.SIGINT, signal.default_int_handler)

# The suite's exactness checks (log-probs to 1e-4, TRL's loss against ours to 1e-5) are
# float32's: on a CPU with bf16 instructions `auto` would mean bf16. Set before any test
# starts, so the CLI processes tests start see it too; tests/test_dtypes.py checks the rule.
os.environ.setdefault("AGENTGYM_CPU_DTYPE", "float32")

LONGEST_FILES = ("test_trainer.py", "test_vllm.py")
"""The files that take longest (learning tests: minutes each; a vLLM engine), longest first."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Collect the longest files first. ``make test`` hands files to its two workers in
    collection order (``--dist loadfile --no-loadscope-reorder``): started first, one per
    worker, they overlap the many short files instead of leaving one worker alone with them
    for the suite's last minutes (23 min against 19 measured on 2026-11-27)."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FILES)))


@pytest.fixture(scope="session", autouse=True)
def agentgym_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Generated games etc. go to one cache per test run (shared by servers and subprocesses,
    and by the run's xdist workers: every cache writer renames complete files into place, so
    a game or converted model is made once, not once per worker)."""
    path = os.environ.get("AGENTGYM_TEST_CACHE")
    if not path and os.environ.get("PYTEST_XDIST_WORKER"):
        path = str(tmp_path_factory.getbasetemp().parent / "agentgym-cache")
    path = path or str(tmp_path_factory.mktemp("agentgym-cache"))
    old = os.environ.get("AGENTGYM_CACHE")
    os.environ["AGENTGYM_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("AGENTGYM_CACHE", None)
    else:
        os.environ["AGENTGYM_CACHE"] = old


@pytest.fixture(scope="session")
def textworld_url(agentgym_cache: str) -> Iterator[str]:
    """A real textworld server on loopback, shared by the tests that only read or use own sessions."""
    with serve_in_thread(ServerConfig(env="textworld", max_sessions=128)) as url:
        yield url


@pytest.fixture(scope="session")
def choice_url(agentgym_cache: str) -> Iterator[str]:
    """A real choice server on loopback, shared by the tests that only use their own sessions."""
    with serve_in_thread(ServerConfig(env="choice")) as url:
        yield url


REPO = Path(__file__).resolve().parent


def run_cli(*args: str) -> tuple[int, str]:
    """`agentgym ARGS` in this process: exit code and output, its whitespace runs made single
    spaces (rich wraps long lines)."""
    from typer.testing import CliRunner

    from agentgym.cli import app

    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


class ModelServer(NamedTuple):
    process: subprocess.Popen
    base_url: str
    """Its /v1 base URL."""
    startup: str
    """What it printed until Uvicorn was running."""


@contextlib.contextmanager
def model_server(model: Path | str, *options: str) -> Iterator[ModelServer]:
    """`agentgym serve-model --model MODEL OPTIONS` as a user starts it, on a free port;
    terminated (if still running) on exit."""
    from agentgym.servers.launcher import free_port

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "agentgym.cli",
        "serve-model",
        "--model",
        str(model),
        "--port",
        str(port),
    ]
    server = subprocess.Popen(
        [*command, *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        output = read_until(server, "Uvicorn running", timeout=120)
        assert "Uvicorn running" in output, output
        yield ModelServer(server, f"http://127.0.0.1:{port}/v1", output)
    finally:
        if server.poll() is None:
            server.terminate()
            server.wait(timeout=30)


@contextlib.contextmanager
def served_model(model: Path | str) -> Iterator[str]:
    """`agentgym serve-model --model MODEL` as a user starts it; yields its /v1 base URL."""
    with model_server(model) as server:
        yield server.base_url


def send_raw(
    http: httpx.Client, method: str, path: str, body: object | str | bytes = b"", **kwargs: object
) -> tuple[int | None, dict]:
    """(status, JSON body) of a request whose body is sent as given (a str or bytes as is,
    anything else as JSON); (None, {}) when the server died, hung or dropped the connection,
    so that a crash fails the caller's assertion instead of raising out of the test."""
    content = body if isinstance(body, str | bytes | Iterator) else json.dumps(body)
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    try:
        response = http.request(method, path, content=content, headers=headers, **kwargs)
    except httpx.TransportError:
        return None, {}
    try:
        return response.status_code, response.json()
    except ValueError:
        return response.status_code, {"text": response.text}


def engine_errors(http: httpx.Client) -> float:
    """An env server's ``agentgym_sessions_engine_errors`` gauge (``http`` has its base URL)."""
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("agentgym_sessions_engine_errors{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no engine-error metric")


def run_metrics(run: Path) -> list[dict]:
    """A training run's ``metrics.jsonl``, one record per step (every line must parse); a
    run without behaviour cloning's step-0 evaluation of the untrained policy is left out
    (:func:`untrained_evaluation`)."""
    return [record for record in all_records(run) if record.get("phase") != "start"]


def short_rl_config(model: Path, url: str, env: str, **overrides: object) -> TrainConfig:
    """A few short one-turn RL steps on ``env`` at ``url`` (sync or async, any generator)."""
    from agentgym.trainers.config import TrainConfig

    values = dict(
        env=env,
        env_url=url,
        model=str(model),
        schedule="fixed",
        max_turns=1,
        bc_steps=0,
        steps=3,
        tasks_per_step=2,
        group_size=4,
        max_new_tokens=4,
        agent_format="plain",
        minibatch_size=8,  # one optimizer step per batch: a sync update starts on-policy
        micro_batch_size=4,
        entropy_coef=0.05,
        learning_rate=5e-3,
        eval_every=0,
        eval_tasks=2,
    )
    return TrainConfig(**(values | overrides))


def untrained_evaluation(run: Path) -> dict:
    """The step-0 record: held-out success of the untrained policy (runs without cloning)."""
    (record,) = [record for record in all_records(run) if record.get("phase") == "start"]
    return record


def all_records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def tiny_llama(vocab_size: int = 50, seed: int = 0) -> LlamaForCausalLM:
    """A two-layer Llama with random weights: cheap where a test needs a real model, not a good one."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


TINY_RUN = {
    "algo": "grpo",
    "env": "choice",
    "schedule": "fixed",
    "max_turns": 1,
    "bc_steps": 0,
    "steps": 2,
    "tasks_per_step": 2,
    "group_size": 2,
    "max_new_tokens": 4,
    "agent_format": "plain",
    "eval_every": 0,
    "eval_tasks": 2,
    "report_to": [],
}
"""Two RL steps on ``choice`` with the tiny model: a checkpoint after each."""


def read_until(proc: subprocess.Popen, marker: str, timeout: float) -> str:
    """A child's output lines until one holds ``marker`` (or it exits, or ``timeout`` s pass)."""
    output, deadline = "", time.monotonic() + timeout
    while marker not in output and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        output += line
    return output


def stop_with_ctrl_c(proc: subprocess.Popen, children: list[psutil.Process], output: str) -> None:
    """Ctrl-C a running ``agentgym up``: it must exit 0, say so, and leave no child behind."""
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, output + rest
    assert "all servers stopped" in rest
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory, agentgym_cache: str) -> Path:
    """A model folder any policy or trainer loads: :func:`tiny_llama` with SmolLM2's tokenizer
    (from ``AGENTGYM_TEST_TOKENIZER`` where set: the GPU kit carries the tokenizer, not the
    model package)."""
    from transformers import AutoTokenizer

    from agentgym.policies.models import resolve_model

    folder = tmp_path_factory.mktemp("tiny-llama")
    source = os.environ.get("AGENTGYM_TEST_TOKENIZER") or resolve_model("smollm2-135m")
    tokenizer = AutoTokenizer.from_pretrained(source)
    tiny_llama(vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@contextlib.contextmanager
def gateway_over(replicas: list[str]) -> Iterator[str]:
    """A gateway in a thread in front of ``replicas`` (choice servers); yields its URL."""
    from agentgym.servers.gateway import GatewayConfig, create_gateway_app

    config = GatewayConfig({"choice": replicas}, health_interval=0.3)
    with serve_in_thread(create_gateway_app(config)) as url:
        yield url


def start_up(args: list[str], *, background: bool = False) -> subprocess.Popen:
    """`agentgym up ARGS` as a user runs it, its output readable line by line; ``background``:
    as `up ... &` in a non-interactive shell, which starts it with SIGINT ignored."""
    return subprocess.Popen(
        [sys.executable, "-m", "agentgym.cli", "up", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
        preexec_fn=(lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) if background else None,
    )
