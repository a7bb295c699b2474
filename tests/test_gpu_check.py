"""The GPU check's twin on this CPU: the kit built for this machine's Python, a bare venv
that sees only torch, transformers, peft and accelerate (and what they need, less what the
kit carries: the lent GPU machine at its barest), and the device's plan run there with
``--device cpu --tiny``. A kit that misses a dependency fails here, not on the device."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_kit  # noqa: E402 - bench/ is not a package

ABSENT_THERE = ("agentgym", "fastapi", "pydantic", "uvicorn", "httpx", "gymnasium", "typer", "rich", "pytest")
"""What the lent machine does not have (the kit brings it)."""


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the bare venv's Python, a kit for it)."""
    root = tmp_path_factory.mktemp("gpu-twin")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    build = [sys.executable, str(ROOT / "bench" / "gpu_kit.py"), "build", str(root / "kit")]
    subprocess.run([*build, "--python-version", version], check=True, capture_output=True, timeout=300)
    return gpu_kit.twin(root / "twin"), root / "kit"


def test_the_bare_venv_lacks_what_the_device_lacks(twin: tuple[Path, Path]) -> None:
    python, _ = twin
    probe = f"import importlib.util as u; print([n for n in {ABSENT_THERE!r} if u.find_spec(n)])"
    found = subprocess.run([python, "-P", "-c", probe], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
    has = "import torch, numpy; print('ok')"  # the rest of transformers' needs comes with the kit
    assert subprocess.run([python, "-c", has], capture_output=True, text=True).stdout.strip() == "ok"


def test_the_device_plan_runs_from_the_kit_in_the_bare_venv(twin: tuple[Path, Path], tmp_path: Path) -> None:
    python, kit = twin
    out, work = tmp_path / "out", tmp_path / "work"
    # From the repository root with a relative kit path, as on the device (the loop's CLI
    # processes run from their work folder: the kit must be found from there too).
    command = [python, "bench/gpu_check.py", "--kit", os.path.relpath(kit, ROOT), "--out", str(out)]
    command += ["--work", str(work), "--device", "cpu", "--tiny", "--phases", "micro,loop"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    phases = json.loads((out / "gpu-check.json").read_text())["phases"]
    assert list(phases) == ["micro", "loop"] and all(p["exit"] == 0 for p in phases.values())
    installed = (kit / f"site-{sys.version_info.major}.{sys.version_info.minor}" / ".installed").read_text()
    assert "agentgym_platform" in installed and "pydantic" in installed

    micro = json.loads((out / "gpu-micro.json").read_text())
    assert all(m["match"] for m in micro["match"]) and micro["checkpoint_round_trip"] is True

    loop = json.loads((out / "gpu-loop.json").read_text())
    arm = loop["arms"]["lora"]
    assert (arm["train_exit"], arm["eval_exit"]) == (0, 0)
    assert arm["checkpoints"] and arm["eval"]["episodes"] == 2 and arm["eval"]["errored"] == 0
    assert [s["phase"] for s in arm["steps"]] == ["bc", "rl"]
    rl = arm["steps"][-1]
    assert rl["episodes_per_min"] > 0 and rl["generated_tokens_s"] > 0 and rl["update_tokens_s"] > 0
    shares = [rl[f"{part}_share"] for part in ("generation", "env", "update", "other")]
    assert rl["generation_share"] > 0 and sum(shares) == pytest.approx(1.0, abs=0.01)


def test_the_kit_brings_the_test_runner_the_suite_settings_need(twin: tuple[Path, Path]) -> None:
    """The device's third phase runs pytest from the kit: pytest and the plugins of the
    suite's settings (asyncio_mode, timeout) and of `make test` (-n) load in the bare venv
    (the phase itself, whose conftest imports the project, ran on the GPU)."""
    python, kit = twin
    install = [python, str(ROOT / "bench" / "gpu_kit.py"), "install", str(kit)]  # once: then it is there
    subprocess.run(install, check=True, capture_output=True)
    site = kit / f"site-{sys.version_info.major}.{sys.version_info.minor}"
    env = {**os.environ, "PYTHONPATH": str(site)}
    versions = [python, "-P", "-m", "pytest", "-VV", "--noconftest", "-p", "no:cacheprovider"]
    done = subprocess.run(versions, capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert all(plugin in done.stdout + done.stderr for plugin in ("asyncio", "timeout", "xdist"))
