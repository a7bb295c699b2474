"""The deployment files written from the registry and each env's ``hosting.toml``.

``agentgym generate`` writes them (``--check`` says which are stale; a test runs it):
``compose.yaml``, ``docker/Dockerfile``, ``docs/api.md`` and the docs' port and env tables. Nothing in them
is kept by hand per env: a new env's service, image and port come from its folder.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Callable
from pathlib import Path

from agentgym import hosting, registry
from agentgym.servers.apidoc import api_reference
from agentgym.servers.launcher import BASE_PORT, PLUGIN_OFFSETS, default_port

GATEWAY_SERVICE = "envs"

COMPOSE_HEADER = """\
# The AgentGym environment fleet: every env server in its own container, and the gateway.
# Written by `agentgym generate` from the registry and each env's envs/NAME/hosting.toml:
# edit those, not this file.
#
#   docker compose up envs         # all of it; clients use http://127.0.0.1:8100/envs/<env>
#   docker-compose up envs         # the same with Compose v1 (Debian's docker-compose 1.29)
#   docker compose up textworld    # one env server alone
#
# Written in the subset Compose v1 (>= 1.27) and v2 both read: no `include:`, no `!reset`.
# Images come from docker/Dockerfile (one target per image). Service `envs` is the gateway
# (`agentgym gateway`); it starts once every env server's healthcheck passes. Settings come
# from environment variables (or a .env file next to this one): AGENTGYM_BIND (interface
# published ports bind, default 127.0.0.1), GATEWAY_PORT and <ENV>_PORT (published host
# ports), MAX_SESSIONS (<ENV>_MAX_SESSIONS where an env sets its own cap), SESSION_TTL,
# AGENTGYM_TOKEN (bearer token every env server requires; the gateway passes it through),
# an env's own settings (below), AGENTGYM_TAG (image tag), AGENTGYM_BASE_IMAGE (the image
# the Dockerfile starts from; see docker/offline-base.sh). Caches (generated games,
# indexes) live in the volume `agentgym-cache`. More replicas of an env, and the whole fleet
# checked end to end (`make docker-check`): docs/deployment.md.

x-build: &build
  context: .
  dockerfile: docker/Dockerfile
  args: { BASE_IMAGE: "${AGENTGYM_BASE_IMAGE:-python:3.11-slim}" }

x-healthcheck: &healthcheck
  # Python's urllib, so no image needs curl; AGENTGYM_PORT is the port the server listens on.
  test: ["CMD", "python", "-c", "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\\"AGENTGYM_PORT\\"]}/health', timeout=4)"]
  interval: 10s
  timeout: 5s
  start_period: 60s
  retries: 5

x-env-server: &env-server
  volumes: [agentgym-cache:/cache]
  restart: unless-stopped
  healthcheck: *healthcheck

services:
"""

DOCKERFILE_HEADER = """\
# AgentGym images: one target per env extra, each installing only that extra (and its
# system packages), plus `core` for the gateway and the envs that need no extra. Written by
# `agentgym generate` from the registry and each env's envs/NAME/hosting.toml: edit those,
# not this file. The build context is the repository root (compose.yaml builds them all).
#
#   docker build -f docker/Dockerfile --target textworld -t agentgym-textworld .
#   docker run -p 8101:8101 agentgym-textworld
#
# Each target's Python packages are installed into the venv /opt/venv in a `*-venv` stage
# that has a C compiler and make (jericho, TextWorld's game engine, is an sdist that needs
# both); the final image copies only that venv, so no image ships a compiler. Every image
# runs as the unprivileged user `agentgym`, keeps caches (generated games, indexes) in the
# volume /cache, and has a HEALTHCHECK on its own /health. No line needs BuildKit, so the
# classic builder (what Debian's docker-compose 1.29 uses) builds it too. No Docker Hub?
# docker/offline-base.sh builds the base image from Debian's packages (docs/deployment.md).

# Any Debian-based image with python3 (>= 3.11), pip and venv.
ARG BASE_IMAGE=python:3.11-slim

# ----- base: the user, the runtime settings, the healthcheck; no dependencies ------------
FROM ${BASE_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \\
    PYTHONUNBUFFERED=1 \\
    PIP_NO_CACHE_DIR=1 \\
    PIP_DISABLE_PIP_VERSION_CHECK=1 \\
    PATH=/opt/venv/bin:$PATH \\
    AGENTGYM_CACHE=/cache \\
    AGENTGYM_PORT=8000
RUN useradd --create-home --uid 10001 agentgym \\
 && mkdir -p /cache \\
 && chown agentgym:agentgym /cache
WORKDIR /home/agentgym
VOLUME /cache
# Python's own urllib, so no image needs curl; AGENTGYM_PORT is also the port `agentgym
# serve` / `agentgym gateway` listen on when no --port is given.
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=5 \\
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(f'http://127.0.0.1:{os.environ[\\"AGENTGYM_PORT\\"]}/health', timeout=4)"]

# ----- builder: a C compiler, make, an empty venv and the source tree -----------------------
FROM base AS builder
RUN apt-get update -qq \\
 && apt-get install -y -qq --no-install-recommends build-essential \\
 && rm -rf /var/lib/apt/lists/* \\
 && python3 -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY agentgym agentgym
COPY envs envs
COPY servers servers
COPY trainers trainers

# ----- core: the gateway and the envs that need no extra ----------------------------------
# Its default command is the gateway; mount its replica list at /etc/agentgym/gateway.yaml
# ({replicas: {ENV: [URL, ...]}}) or give --replica flags instead.
FROM builder AS core-venv
RUN pip install .

FROM base AS core
COPY --from=core-venv /opt/venv /opt/venv
USER agentgym
ENV AGENTGYM_PORT=8100
EXPOSE 8100
CMD ["agentgym", "gateway", "--host", "0.0.0.0", "--config", "/etc/agentgym/gateway.yaml"]
"""


def declarations() -> list[hosting.Hosting]:
    """Every built-in env's hosting, in port order."""
    return hosting.builtin()


def port(env: str) -> int:
    """``env``'s port at the default base: generated files never follow ``$AGENTGYM_BASE_PORT``."""
    return default_port(env, BASE_PORT)


def _quoted(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(item) for item in items) + "]"


def _compose_service(declared: hosting.Hosting) -> str:
    env, variable = declared.env, declared.env.upper()
    cap = (
        "MAX_SESSIONS"
        if declared.max_sessions == hosting.DEFAULT_MAX_SESSIONS
        else f"{variable}_MAX_SESSIONS"
    )
    command = [
        "agentgym",
        "serve",
        env,
        "--host",
        "0.0.0.0",
        "--max-sessions",
        f"${{{cap}:-{declared.max_sessions}}}",
    ]
    command += ["--ttl", "${SESSION_TTL:-600}"]
    for setting in declared.settings:
        command += ["--set", f"{setting.name}=${{{setting.variable}:-{setting.default}}}"]
    lines = [f"  {env}:", *_comment(declared.note, "    ")]
    lines += [
        "    <<: *env-server",
        f"    build: {{ <<: *build, target: {declared.image} }}",
        f"    image: agentgym-{declared.image}:${{AGENTGYM_TAG:-latest}}",
        f'    environment: {{ AGENTGYM_PORT: "{port(env)}", AGENTGYM_TOKEN: "${{AGENTGYM_TOKEN:-}}" }}',
        f"    command: {_quoted(command)}",
        f'    ports: ["${{AGENTGYM_BIND:-127.0.0.1}}:${{{variable}_PORT:-{port(env)}}}:{port(env)}"]',
    ]
    return "\n".join(lines) + "\n"


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, 88 - len(indent))]


def _compose_gateway(envs: list[str]) -> str:
    replicas = "".join(f"      - --replica\n      - {env}=http://{env}:{port(env)}\n" for env in envs)
    waits = "".join(f"      {env}: {{ condition: service_healthy }}\n" for env in envs)
    return (
        f"  {GATEWAY_SERVICE}:\n"
        "    build: { <<: *build, target: core }\n"
        "    image: agentgym-core:${AGENTGYM_TAG:-latest}\n"
        "    restart: unless-stopped\n"
        "    healthcheck: *healthcheck\n"
        f'    environment: {{ AGENTGYM_PORT: "{BASE_PORT}", AGENTGYM_TOKEN: "${{AGENTGYM_TOKEN:-}}" }}\n'
        "    command:\n      - agentgym\n      - gateway\n      - --host\n      - 0.0.0.0\n"
        f"{replicas}"
        f'    ports: ["${{AGENTGYM_BIND:-127.0.0.1}}:${{GATEWAY_PORT:-{BASE_PORT}}}:{BASE_PORT}"]\n'
        f"    depends_on:\n{waits}"
    )


def compose_yaml() -> str:
    declared = declarations()
    services = "\n".join(_compose_service(d) for d in declared)
    gateway = _compose_gateway([d.env for d in declared])
    return f"{COMPOSE_HEADER}{services}\n{gateway}\nvolumes:\n  agentgym-cache:\n"


def _image_stage(extra: str, envs: list[hosting.Hosting]) -> str:
    apt = sorted({package for declared in envs for package in declared.apt})
    title = f"# ----- {extra}: serves {', '.join(d.env for d in envs)} "
    lines = [
        title.ljust(90, "-"),
        *_comment(" ".join(d.note for d in envs), ""),
        f"FROM builder AS {extra}-venv",
    ]
    lines += [f'RUN pip install ".[{extra}]"', "", f"FROM base AS {extra}"]
    if apt:
        lines += [
            "RUN apt-get update -qq \\",
            f" && apt-get install -y -qq --no-install-recommends {' '.join(apt)} \\",
            " && rm -rf /var/lib/apt/lists/*",
        ]
    first = port(envs[0].env)
    lines += [f"COPY --from={extra}-venv /opt/venv /opt/venv", "USER agentgym", f"ENV AGENTGYM_PORT={first}"]
    lines += [f"EXPOSE {first}", f'CMD ["agentgym", "serve", "{envs[0].env}", "--host", "0.0.0.0"]']
    return "\n".join(lines) + "\n"


def dockerfile() -> str:
    by_extra: dict[str, list[hosting.Hosting]] = {}
    for declared in declarations():
        if declared.extra:
            by_extra.setdefault(declared.extra, []).append(declared)
    stages = "\n".join(_image_stage(extra, envs) for extra, envs in by_extra.items())
    return f"{DOCKERFILE_HEADER}\n{stages}"


def port_table() -> str:
    """The markdown port table (docs/deployment.md)."""
    envs = registry.builtin_names()
    plugins = range(BASE_PORT + PLUGIN_OFFSETS.start, BASE_PORT + PLUGIN_OFFSETS.stop)
    head = ["gateway", *envs, "other envs"]
    ports = [
        str(BASE_PORT),
        *(str(port(env)) for env in envs),
        f"{plugins.start}-{plugins.stop - 1} (a hash of the name)",
    ]
    return "\n".join(["| " + " | ".join(row) + " |" for row in (head, ["---"] * len(head), ports)]) + "\n"


def env_table() -> str:
    """The markdown table of the built-in envs (docs/environments.md): page, port, what it is."""
    rows = ["| env | page | port | what it is |", "| --- | --- | --- | --- |"]
    for env in registry.builtin_names():
        page = f"[envs/{env}/README.md](../envs/{env}/README.md)"
        rows.append(f"| `{env}` | {page} | {port(env)} | {registry.resolve(env).description} |")
    return "\n".join(rows) + "\n"


README_ENV_ROW = "| envs: "
"""How the README's feature-table row of the built-in envs starts (it is generated)."""


def readme_env_row() -> str:
    """The README's row of the built-in envs: each name, with its declaration's highlight."""
    named = [f"`{h.env}`" + (f" ({h.highlight})" if h.highlight else "") for h in declarations()]
    return (
        f"{README_ENV_ROW}{', '.join(named)}; a new one: `agentgym new-env NAME` "
        "| ✅ [environments.md](docs/environments.md) |"
    )


def _readme(path: Path) -> Callable[[], str]:
    """The README at ``path`` with its env row (the line starting :data:`README_ENV_ROW`) rewritten."""

    def render() -> str:
        lines = path.read_text().split("\n")
        rows = [i for i, line in enumerate(lines) if line.startswith(README_ENV_ROW)]
        if len(rows) != 1:
            raise ValueError(f"{path} needs exactly one feature-table row starting {README_ENV_ROW!r}")
        lines[rows[0]] = readme_env_row()
        return "\n".join(lines)

    return render


def _between_markers(path: Path, name: str, body: Callable[[], str]) -> Callable[[], str]:
    """The file at ``path`` with the block between ``<!-- generated: NAME -->`` and
    ``<!-- end generated -->`` rewritten."""

    def render() -> str:
        text = path.read_text()
        pattern = re.compile(rf"(<!-- generated: {name} -->\n).*?(<!-- end generated -->)", re.S)
        if not pattern.search(text):
            raise ValueError(f"{path} has no '<!-- generated: {name} -->' block")
        return pattern.sub(lambda m: m.group(1) + body() + m.group(2), text)

    return render


def generated_files(root: Path) -> dict[Path, Callable[[], str]]:
    """Each generated file under the repository ``root`` and what renders its content."""
    return {
        root / "compose.yaml": compose_yaml,
        root / "docker" / "Dockerfile": dockerfile,
        root / "docs" / "api.md": api_reference,
        root / "docs" / "deployment.md": _between_markers(
            root / "docs" / "deployment.md", "ports", port_table
        ),
        root / "docs" / "environments.md": _between_markers(
            root / "docs" / "environments.md", "envs", env_table
        ),
        root / "README.md": _readme(root / "README.md"),
    }
