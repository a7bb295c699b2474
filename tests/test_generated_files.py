"""Files written from the registry stay current, and a new env is one folder.

``agentgym generate`` writes compose.yaml, the Dockerfile, docs/api.md and the docs' port
table and the README's env row; ``agentgym new-env`` makes a working env folder. The second test runs both in a
scratch copy of the checkout (the editable install pointed at it), so the repository is
never touched.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from agentgym.cli import app

ROOT = Path(__file__).resolve().parent.parent
COPIED = [
    "agentgym", "envs", "servers", "trainers", "docs", "docker", "compose.yaml", "pyproject.toml", "README.md"
]  # fmt: skip


def test_every_generated_file_is_current() -> None:
    result = CliRunner().invoke(app, ["generate", "--check", "--root", str(ROOT)])
    assert result.exit_code == 0, f"stale: run `agentgym generate`\n{result.output}"


def scratch_checkout(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A copy of the checkout, and the environment whose Python imports agentgym from it."""
    root = tmp_path / "checkout"
    for name in COPIED:
        source, target = ROOT / name, root / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    (finder,) = [
        name for name, module in sys.modules.items() if name.startswith("__editable__") and "agentgym" in name
    ]
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import {finder} as finder\n"
        "for key, value in finder.MAPPING.items():\n"
        f"    finder.MAPPING[key] = value.replace({str(ROOT)!r}, {str(root)!r})\n"
    )
    return root, {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}


def changed_files(before: Path, after: Path) -> set[str]:
    """Files added or changed in ``after`` relative to ``before`` (paths under ``after``)."""
    changed = set()
    for path in after.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            relative = path.relative_to(after)
            old = before / relative
            if not old.exists() or old.read_bytes() != path.read_bytes():
                changed.add(str(relative))
    return changed


def test_a_new_env_is_one_folder_and_is_served_and_checked(tmp_path: Path) -> None:
    root, env = scratch_checkout(tmp_path)

    def run(*command: str, where: Path = tmp_path) -> subprocess.CompletedProcess:
        return subprocess.run(command, cwd=where, env=env, capture_output=True, text=True)

    outside = run(sys.executable, "-m", "agentgym.cli", "new-env", "elsewhere")  # cwd: no checkout
    assert outside.returncode == 2 and "is not inside an AgentGym checkout" in outside.stderr, outside.stderr
    assert changed_files(ROOT, root) == set()  # the package's own tree untouched
    made = run(sys.executable, "-m", "agentgym.cli", "new-env", "guess", where=root)  # inside it
    assert made.returncode == 0, made.stdout + made.stderr
    changed = changed_files(ROOT, root)
    folder = {path for path in changed if path.startswith("envs/guess/")}
    assert folder >= {f"envs/guess/{name}" for name in ("env.py", "README.md", "hosting.toml", "recipe.yaml")}
    # No Python outside the folder is written: its hosting.toml registers it, on the next port.
    assert changed - folder == {"compose.yaml", "docs/deployment.md", "docs/environments.md", "README.md"}
    declared = (root / "envs/guess/hosting.toml").read_text()
    assert 'factory = "GuessEnv"' in declared and "port = 9" in declared, declared
    assert (
        "  guess:\n" in (root / "compose.yaml").read_text() and "8109" in (root / "compose.yaml").read_text()
    )
    assert "`babyai`, `guess`; a new one" in (root / "README.md").read_text()
    # its own test serves it over HTTP, runs check-env against it and plays the expert
    tested = run(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "envs/guess", where=root)
    assert tested.returncode == 0 and "2 passed" in tested.stdout, tested.stdout + tested.stderr
    ruff = str(Path(sys.executable).with_name("ruff"))
    for check in (["check"], ["format", "--check"]):  # the scaffold is code to hand over, too
        linted = run(ruff, *check, "envs/guess", where=root)
        assert linted.returncode == 0, linted.stdout
    again = run(sys.executable, "-m", "agentgym.cli", "new-env", "guess", "--root", str(root))
    assert again.returncode == 2 and "exists already" in again.stdout + again.stderr

    # A step that fails (here the regeneration: compose.yaml cannot be written) leaves nothing.
    (root / "compose.yaml").unlink()
    (root / "compose.yaml").mkdir()
    broken = run(sys.executable, "-m", "agentgym.cli", "new-env", "broken", "--root", str(root))
    assert broken.returncode == 1 and "failed and changed nothing" in broken.stderr, broken.stderr
    assert "Traceback" not in broken.stderr
    (root / "compose.yaml").rmdir()
    now = {path for path in changed_files(ROOT, root) if not path.startswith(".ruff_cache/")}
    assert now == changed - {"compose.yaml"}  # as before
    assert not any(path.name.startswith((".broken", "broken")) for path in (root / "envs").iterdir())
