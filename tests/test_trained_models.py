"""From a training run to a model you can use (issue 21), as a user runs it: a tiny run
trained with `agentgym train`, then `agentgym eval --model RUN` on the test split,
`agentgym export` to a folder plain `transformers` loads and generates with
(`agentgym serve-model` and the real model's replies outside the trainer:
tests/test_trainer.py). Also: checkpoint retention in a real run,
and the fast, clear errors for a model that is not there. A two-layer random Llama with
SmolLM2's tokenizer keeps it cheap."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_trainer_recipes import train
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentgym.api import evaluate
from agentgym.policies.hf import HFPolicy
from agentgym.records.trajectory import read_jsonl
from agentgym.servers.launcher import free_port
from conftest import run_cli as cli
from conftest import run_metrics

RUN_SETTINGS = {  # on top of test_trainer_recipes.TINY
    "bc_steps": 2,  # cloning moves the adapters whatever the (random) model earns
    "bc_batch_size": 2,
    "max_turns": 1,
    "eval_every": 1,
    "keep_checkpoints": 1,
    "action_order": "listed",
}
EVAL_ARGS = ["--n", "2", "--max-turns", "1", "--max-new-tokens", "4"]


@pytest.fixture(scope="module")
def tiny_run(tiny_model_dir: Path, choice_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 3-step run (2 cloning steps, 1 GRPO step) of the tiny model on `choice`."""
    run = tmp_path_factory.mktemp("runs") / "grpo-choice"
    code, output = train(run, "grpo", tiny_model_dir, env="choice", env_url=choice_url, **RUN_SETTINGS)
    assert code == 0, output
    return run


def test_a_run_keeps_its_newest_checkpoint_and_its_best(tiny_run: Path) -> None:
    history = run_metrics(tiny_run)
    assert [r["step"] for r in history] == [1, 2, 3]
    best = max((r["val_success_rate"], r["step"]) for r in history if "val_success_rate" in r)[1]
    kept = sorted(p.name for p in (tiny_run / "checkpoints").glob("step-*"))
    assert kept == sorted({f"step-{best:06d}", "step-000003"})  # keep_checkpoints=1, plus the best


def test_eval_takes_a_run_folder_or_a_checkpoint(tiny_run: Path, choice_url: str, tmp_path: Path) -> None:
    for model, out in [
        (tiny_run, tmp_path / "run"),
        (tiny_run / "checkpoints" / "step-000003", tmp_path / "ckpt"),
    ]:
        code, output = cli("eval", "--env", "choice", "--url", choice_url, "--model", str(model), "--format",
                           "plain", *EVAL_ARGS, "--out", str(out))  # fmt: skip
        assert code == 0, output
        results = json.loads((out / "results.json").read_text())
        assert results["episodes"] == 2 and results["errored"] == 0 and results["split"] == "test"
        assert results["model"]["spec"] == str(model)
        assert results["model"]["checkpoint"] == str(tiny_run / "checkpoints" / "step-000003")
        assert len(results["model"]["sha256"]) == 64
    hashes = {
        json.loads((tmp_path / o / "results.json").read_text())["model"]["sha256"] for o in ("run", "ckpt")
    }
    assert len(hashes) == 1  # the same weights, named two ways


def test_eval_plays_a_run_as_its_held_out_evaluation_did_unless_told_otherwise(
    tiny_run: Path, choice_url: str, tmp_path: Path
) -> None:
    """The tiny run trained plain 4-token replies at one turn with the valid commands shown;
    eval's own defaults are react, 128 tokens, the env's turn limit and none shown."""
    base = ["eval", "--env", "choice", "--url", choice_url, "--model", str(tiny_run), "--n", "2"]
    code, output = cli(*base, "--out", str(tmp_path / "as-run"))
    assert code == 0, output
    assert "playing as the run's held-out evaluation did" in output
    played = json.loads((tmp_path / "as-run" / "results.json").read_text())["config"]
    assert (played["format"], played["max_new_tokens"], played["max_turns"]) == ("plain", 4, 1)
    assert (played["show_actions"], played["action_order"], played["constrain_actions"]) == (
        True,
        "listed",
        False,
    )

    told = ["--format", "react", "--max-new-tokens", "6", "--no-show-actions", "--action-order", "hashed"]
    code, output = cli(*base, *told, "--out", str(tmp_path / "told"))
    assert code == 0, output
    played = json.loads((tmp_path / "told" / "results.json").read_text())["config"]
    assert (played["format"], played["max_new_tokens"], played["max_turns"]) == ("react", 6, 1)
    assert played["show_actions"] is False and played["action_order"] == "hashed"
    code, output = cli(*base, "--action-order", "random", "--out", str(tmp_path / "bad"))
    assert code == 2 and "unknown action order 'random'; orders are hashed, listed" in output, output

    legacy = tmp_path / "legacy-run"  # a run from before play.json: read from its config
    shutil.copytree(tiny_run, legacy, ignore=shutil.ignore_patterns("play.json"))
    legacy_base = [*base[:-4], "--model", str(legacy), "--n", "2"]
    code, output = cli(*legacy_base, "--out", str(tmp_path / "legacy"))
    assert code == 0 and "playing as the run's held-out evaluation did" in output, output
    played = json.loads((tmp_path / "legacy" / "results.json").read_text())["config"]
    assert (played["format"], played["max_new_tokens"], played["show_actions"]) == ("plain", 4, True)
    assert played["action_order"] == "listed"
    # From Python the old run plays exactly as from the CLI (one play profile, one reader).
    from_python = evaluate("choice", legacy, n=2, url=choice_url, out=tmp_path / "legacy-py")["config"]
    assert from_python == played


def test_export_writes_a_folder_plain_transformers_loads(
    tiny_run: Path, tiny_model_dir: Path, choice_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    code, output = cli("export", str(tiny_run), "--out", str(out))
    assert code == 0, output
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= {
        p.name for p in out.iterdir()
    }
    card = (out / "README.md").read_text()
    assert "step 3" in card and "eval_success_rate" in card and "algo: grpo" in card  # figures and config
    assert "weights: float32, the dtype the run trained and was evaluated in" in card  # the dtype rule
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.iterdir())  # shareable, as the folder

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.float32  # the run trained on CPU: float32 by the dtype rule
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("You see a red door.", return_tensors="pt").input_ids
    generated = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert generated.shape[1] == ids.shape[1] + 3
    # Its own generation config stops where the run's replies stopped: the end of turn, the
    # run's reply length, greedy.
    generation = json.loads((out / "generation_config.json").read_text())
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generation["eos_token_id"]
    assert generation["max_new_tokens"] == 4 and generation.get("do_sample") is False
    assert model.generate(ids).shape[1] <= ids.shape[1] + 4

    halved_out = tmp_path / "export-bfloat16"
    code, output = cli("export", str(tiny_run), "--out", str(halved_out), "--dtype", "bfloat16")
    assert code == 0, output
    assert "weights: bfloat16, rounded from the run's float32" in (halved_out / "README.md").read_text()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    served = HFPolicy(str(tiny_run), device="cpu")
    replayed = HFPolicy(str(halved_out), device="cpu")  # its play record: computed in float32
    for policy in (served, replayed):
        asyncio.run(policy.close())
    assert served.model.dtype == replayed.model.dtype == torch.float32
    with torch.no_grad():
        exported, trained, untrained, halved = (
            m(ids).logits.float()
            for m in (model, served.model, base, AutoModelForCausalLM.from_pretrained(halved_out))
        )
    assert torch.allclose(exported, trained, atol=1e-5)  # the default export is the run's model
    assert not torch.allclose(exported, untrained, atol=1e-4)  # with the trained weights merged in
    assert torch.allclose(halved, trained, atol=0.1)  # bfloat16: the same model, rounded

    # The run's play record travels with the export: eval plays the exported model as the run did.
    assert json.loads((out / "play.json").read_text()) == json.loads((tiny_run / "play.json").read_text())
    args = [
        "--env",
        "choice",
        "--url",
        choice_url,
        "--model",
        str(out),
        "--n",
        "2",
        "--out",
        str(tmp_path / "ev"),
    ]
    code, output = cli("eval", *args)
    assert code == 0 and "playing as the run's held-out evaluation did" in output, output
    played = json.loads((tmp_path / "ev" / "results.json").read_text())["config"]
    assert (played["format"], played["max_new_tokens"], played["max_turns"]) == ("plain", 4, 1)

    code, output = cli("export", str(tiny_run), "--out", str(out))
    assert code == 2 and "not an empty folder" in output  # never overwrites
    code, output = cli("export", str(tiny_run), "--dtype", "int8", "--out", str(tmp_path / "int8"))
    assert code == 2 and "unknown dtype 'int8'; choose auto or one of bfloat16, float16, float32" in output
    assert not (tmp_path / "int8").exists()
    code, output = cli("export", str(tiny_run), "--step", "1", "--out", str(tmp_path / "gone"))
    assert code == 2 and "no checkpoint of step 1" in output and not (tmp_path / "gone").exists()


def test_eval_records_schema_seed_commit_and_per_challenge_figures(
    tiny_model_dir: Path, textworld_url: str, tmp_path: Path
) -> None:
    code, output = cli("eval", "--env", "textworld", "--url", textworld_url, "--model", str(tiny_model_dir),
                       "--n", "4", "--max-turns", "1", "--max-new-tokens", "4", "--seed", "7", "--out",
                       str(tmp_path))  # fmt: skip
    assert code == 0, output
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["seed"] == 7 and results["config"]["seed"] == 7 and results["config"]["n"] == 4
    assert len(results["git_commit"]) == 40 and results["model"]["path"] == str(tiny_model_dir)
    # A random model writes no "Action:" line: every reply is invalid, and the summary says so.
    assert results["invalid_reply_rate"] == 1.0 and "invalid_reply_rate" in output
    families = {"tw-coin_collector", "tw-treasure_hunter", "tw-simple", "tw-cooking"}
    assert set(results["by_family"]) == families and all(f in output for f in families), output
    assert all(figures["episodes"] == 1 for figures in results["by_family"].values())
    records = list(read_jsonl(tmp_path / "trajectories.jsonl"))
    assert [r.get("schema_version") for r in records] == [1] * 4  # agentgym.records.trajectory.SCHEMA_VERSION


def test_eval_exits_non_zero_when_the_model_is_unreachable(textworld_url: str, tmp_path: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1"
    code, output = cli("eval", "--env", "textworld", "--url", textworld_url, "--policy", "openai", "--base-url",
                       dead, "--model", "m", "--n", "2", "--max-turns", "1", "--out", str(tmp_path))  # fmt: skip
    assert code == 3, output
    assert "2 of 2 episodes failed for infrastructure reasons" in output
    assert json.loads((tmp_path / "results.json").read_text())["error_kinds"] == {"error:generation": 2}


@pytest.mark.parametrize("offline", [True, False])
def test_an_unknown_model_name_fails_at_once_listing_the_aliases(offline: bool, tmp_path: Path) -> None:
    """No hub answers here: offline mode, or a hub endpoint nobody listens on."""
    hub = {"HF_HUB_OFFLINE": "1"} if offline else {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_ENDPOINT")} | hub
    verbs = [["eval", "--env", "choice"], ["train", "--env", "choice", "--out", str(tmp_path / "run")]]
    for verb in verbs if offline else verbs[:1]:  # one process per case: each pays Python's start-up
        command = [sys.executable, "-m", "agentgym.cli", *verb, "--model", "smollm2-1b"]
        done = subprocess.run(
            command, capture_output=True, text=True, env=env | {"COLUMNS": "300"}, timeout=120
        )
        message = " ".join((done.stdout + done.stderr).split())
        assert done.returncode == 2, message
        assert "'smollm2-1b' is not a known alias (smollm2-135m)" in message
        assert ("HF_HUB_OFFLINE" if offline else "unreachable") in message
    assert not (tmp_path / "run").exists()  # train made nothing before it checked


def test_a_missing_model_folder_fails_at_once(tmp_path: Path) -> None:
    # Longer than a line, with brackets: the message keeps it whole and literal (copyable).
    missing = str(tmp_path / ("no-such-model-" + "x" * 80 + "[v2]"))
    for verb in (["eval", "--out", str(tmp_path / "eval")], ["train", "--out", str(tmp_path / "run")]):
        code, output = cli(*verb, "--env", "choice", "--model", missing)
        assert code == 2 and f"no model folder {missing} (it does not exist)" in output
    assert not (tmp_path / "run").exists() and not (tmp_path / "eval").exists()
