"""The GPU kit: what a bare CUDA machine lacks to run the project, in one folder to carry.

    python bench/gpu_kit.py build runs/gpu-kit [--python-version 3.12]   # here (make gpu-kit)
    python3 bench/gpu_kit.py install runs/gpu-kit                       # there (bench/gpu_check.py does it)
    python bench/gpu_kit.py twin runs/gpu-twin --kit runs/gpu-kit-py311  # here: a bare venv like the device

A lent GPU machine has Python with torch, transformers, peft and accelerate (``HOST``) and
whatever those need, no internet, and nothing of this project. The kit holds:

* ``tokenizer/``: SmolLM2's tokenizer (the check's model shapes run random weights);
* ``wheels/``: the project as a wheel, and a wheel of every distribution it needs at run
  time that ``HOST`` does not bring: the core dependencies, the env's extra, the test runner
  (pytest and the plugins named in the suite's settings). Versions are those installed
  here (what the suite tested), downloaded for the target Python and platform;
* ``kit.json``: what it holds, with sizes, and the host set it assumes.

``install`` puts the wheels whose distribution the running Python lacks, or has in an
older release, into ``KIT/site-X.Y`` with ``pip install --no-deps --no-index --target`` (unpacked by hand where
the Python has no pip, as in the twin's bare venv): the host's own copies win. ``build``
and ``twin`` run in the project's venv; ``install`` runs on the standard library alone.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOST = ("torch", "transformers", "peft", "accelerate")
"""What a lent GPU machine brings. What those need differs between releases and images
(here transformers needs typer, hence pydantic; the lent H200's image had typer but not
pydantic), so the kit assumes only ``BEDROCK`` and carries the rest: ``install`` skips what
the host has in the same or a newer release."""
BEDROCK = ("torch", "numpy")
"""What any machine with torch and transformers has, with everything these need."""
ENV = "babyai"
"""The multi-turn env the kit carries: minigrid is pure Python (TextWorld's engine needs
jericho, an sdist that builds against spacy: no wheel to carry)."""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
"""Linux x86-64 wheels for glibc 2.17 to 2.28: what any current CUDA image can load."""


# ----- build (here) --------------------------------------------------------------------------


def project_requirements(env: str = ENV) -> list[str]:
    """The requirement strings the kit serves, read from pyproject.toml: the core
    dependencies, ``env``'s extra and the test runner (the ``dev`` extra's pytest*)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    runner = [r for r in extras["dev"] if Requirement(r).name.startswith("pytest")]
    return [*project["dependencies"], *extras[env], *runner]


def closure(requirements: list[str], python_version: str) -> dict[str, str]:
    """``{distribution: installed version}`` of ``requirements`` and everything they need,
    as installed here, with markers evaluated for Linux x86-64 and ``python_version``."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    environment = {"python_version": python_version, "python_full_version": f"{python_version}.0"}
    environment |= {"sys_platform": "linux", "platform_machine": "x86_64", "platform_system": "Linux"}
    found: dict[str, str] = {}
    expanded: set[tuple[str, str]] = set()  # (distribution, extra): its requirements queued
    queue = [(Requirement(r), "") for r in requirements]
    while queue:
        requirement, extra = queue.pop()
        if requirement.marker and not requirement.marker.evaluate(environment | {"extra": extra}):
            continue
        name = canonicalize_name(requirement.name)
        dist = importlib.metadata.distribution(name)
        found[name] = dist.version
        for wanted in {"", *requirement.extras} - {e for n, e in expanded if n == name}:
            expanded.add((name, wanted))
            queue += [(Requirement(r), wanted) for r in dist.requires or []]
    return found


def kit_distributions(python_version: str) -> dict[str, str]:
    """What the kit carries: the project's closure less ``BEDROCK``'s."""
    bedrock = closure(list(BEDROCK), python_version)
    ours = closure(project_requirements(), python_version)
    return {name: version for name, version in sorted(ours.items()) if name not in bedrock}


def build(kit: Path, python_version: str) -> None:
    """Write the kit for ``python_version`` into ``kit`` (wheels already there are kept)."""
    wheels = kit / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.glob("agentgym_platform-*.whl"):  # the project: always this tree's
        old.unlink()
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, ROOT], check=True)
    shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' staging folder
    wanted = kit_distributions(python_version)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [*pip, "download", "--no-deps", "--only-binary=:all:", "--python-version", python_version]
        + ["--implementation", "cp", *platforms, "-d", wheels]
        + [f"{name}=={version}" for name, version in wanted.items()],
        check=True,
    )
    save_tokenizer(kit / "tokenizer")
    files = sorted(wheels.glob("*.whl"))
    manifest = {
        "python_version": python_version,
        "platforms": PLATFORMS,
        "host": list(HOST),
        "distributions": wanted,
        "files": {str(f.relative_to(kit)): f.stat().st_size for f in files},
        "mib": round(sum(f.stat().st_size for f in kit.rglob("*") if f.is_file()) / 2**20, 1),
    }
    (kit / "kit.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {kit}: {len(files)} wheels for Python {python_version}, {manifest['mib']} MiB in all")


def save_tokenizer(folder: Path) -> None:
    from transformers import AutoTokenizer

    sys.path.insert(0, str(ROOT))
    from agentgym.policies.models import resolve_model

    AutoTokenizer.from_pretrained(resolve_model("smollm2-135m")).save_pretrained(folder)


# ----- install (there; the standard library only) --------------------------------------------


def site_folder(kit: Path) -> Path:
    return kit / f"site-{sys.version_info.major}.{sys.version_info.minor}"


def install(kit: Path) -> Path:
    """Install the kit's wheels this Python lacks into ``site_folder(kit)`` (once: a second
    call finds it done) and return that folder."""
    site = site_folder(kit)
    stamp = site / ".installed"
    if stamp.exists():
        return site
    manifest = json.loads((kit / "kit.json").read_text())
    wanted = [kit / name for name in manifest["files"] if _lacking(*Path(name).name.split("-")[:2])]
    shutil.rmtree(site, ignore_errors=True)
    site.mkdir(parents=True)
    if _has_pip():
        pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--no-compile"]
        subprocess.run([*pip, "--target", str(site), *map(str, wanted)], check=True)
    else:
        for wheel in wanted:
            _unpack(wheel, site)
    stamp.write_text("\n".join(w.name for w in wanted) + "\n")
    print(f"installed {len(wanted)} of the kit's {len(manifest['files'])} wheels into {site}", flush=True)
    return site


def _lacking(distribution: str, version: str) -> bool:
    """Whether this Python lacks ``distribution`` or has an older release than the kit's
    (an old ``typing_extensions`` beside a new ``pydantic`` fails at import)."""
    try:
        have = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return True
    return _release(version) > _release(have)


def _release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version (``2.13.0+cpu`` -> (2, 13, 0)): enough to order the
    releases of one distribution, with the standard library only."""
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0]))


def _has_pip() -> bool:
    return subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode == 0


def _unpack(wheel: Path, site: Path) -> None:
    """A wheel unpacked as ``pip --target`` would: its ``*.data/{purelib,platlib}`` moved
    to the top (scripts and headers are not needed to import it)."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    for data in site.glob("*.data"):
        for part in ("purelib", "platlib"):
            for entry in (data / part).glob("*") if (data / part).is_dir() else []:
                shutil.move(str(entry), site / entry.name)
        shutil.rmtree(data)


def activate(kit: Path) -> Path:
    """Install the kit where needed and make it importable here and in every process
    started from here (env servers, torchrun ranks, pytest)."""
    site = install(kit.resolve())  # absolute: processes started elsewhere find it too
    sys.path.insert(0, str(site))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    return site


# ----- the twin (here): a bare venv that sees what the device has -------------------------------


def twin(folder: Path) -> Path:
    """A venv in ``folder`` without pip or this project, seeing from this Python's
    site-packages only ``HOST`` and what it needs, less what the kit carries (linked into
    ``folder/host``, named by a ``.pth``): the device at its barest. Returns its Python."""
    shutil.rmtree(folder, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", folder / "venv"], check=True)
    host = folder / "host"
    host.mkdir()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    carried = kit_distributions(version)
    for name in set(closure(list(HOST), version)) - set(carried):
        for top in _top_level_entries(importlib.metadata.distribution(name)):
            if not (host / top.name).exists():
                (host / top.name).symlink_to(top)
    python = folder / "venv" / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (Path(purelib) / "host.pth").write_text(f"{host}\n")
    return python


def _top_level_entries(dist: importlib.metadata.Distribution) -> set[Path]:
    """The files and folders a distribution puts at the top of site-packages."""
    site = Path(sysconfig.get_path("purelib"))
    base = Path(dist.locate_file(""))
    entries = {base / Path(f).parts[0] for f in dist.files or [] if not Path(f).parts[0].startswith("..")}
    return {e for e in entries if e.exists() and e.parent in (site, base)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=["build", "install", "twin"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--python-version", default="3.12", help="build: the target Python (default 3.12)")
    args = parser.parse_args()
    if args.action == "build":
        build(args.folder, args.python_version)
    elif args.action == "install":
        install(args.folder)
    else:
        print(twin(args.folder))


if __name__ == "__main__":
    main()
