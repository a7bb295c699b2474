"""The GPU check runs as it will on the CUDA machine: from this source tree with the
project not installed and FastAPI, pydantic, Gymnasium, uvicorn, gguf and vLLM absent
(here, on the CPU, ``--device cpu --tiny``: a toy shape, seconds)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from agentgym.policies.models import resolve_model

ROOT = Path(__file__).resolve().parents[1]
BARE_MACHINE = """
import sys
# The project is not installed there: drop the editable install's finder.
sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in getattr(f, "__module__", "") + type(f).__module__]
for name in ("fastapi", "pydantic", "gymnasium", "uvicorn", "gguf", "vllm", "starlette"):
    sys.modules[name] = None  # absent there: importing them fails
"""


def test_the_gpu_check_runs_from_the_bare_tree(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(BARE_MACHINE)
    out = tmp_path / "gpu.json"
    command = [sys.executable, str(ROOT / "bench" / "gpu.py"), "--device", "cpu", "--tiny"]
    command += ["--tokenizer", resolve_model("smollm2-135m"), "--out", str(out)]
    probe = "import importlib.util; print(importlib.util.find_spec('agentgym'), importlib.util.find_spec('pydantic'))"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    bare = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert bare.stdout.split() == ["None", "None"], bare.stderr  # neither is importable there
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    rows = {(r["lora"], r["tokens"]) for r in report["rows"]}
    assert rows == {(True, 64), (True, 256), (False, 64), (False, 256)}
    assert all(r["update_tokens_s"] > 0 for r in report["rows"])
    assert any(r.get("generation_tokens_s", 0) > 0 for r in report["rows"])
    assert [m["algo"] for m in report["match"]] == ["bapo", "grpo"] and all(
        m["match"] for m in report["match"]
    )
    assert all(m["grad_norm_cpu"] > 0 and m["step_relative_gap"] < 1e-3 for m in report["match"])
    assert report["checkpoint_round_trip"] is True
    assert report["machine"]["torch"] and report["machine"]["transformers"]
    assert "update tok/s" in done.stdout
