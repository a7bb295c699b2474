"""compose.yaml and docker/Dockerfile, checked without a Docker engine (bench/docker_check.py
builds and runs them for real: ``make docker-check``).

Every service command is parsed by the real CLI (an unknown subcommand, option or bad
value fails), ports are unique, healthchecks exist and really pass against a live server,
the gateway depends on every env server, and every image target exists, installs
only its own env's extra and ships no compiler.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import typer
import typer.main
import yaml

from agentgym import registry
from agentgym.cli import app
from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = (ROOT / "docker" / "Dockerfile").read_text()
GATEWAY = "envs"


def interpolate(value: Any) -> Any:
    """Compose's ``${VAR:-default}``, resolved to the defaults (what an empty .env gives)."""
    if isinstance(value, str):
        return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)
    if isinstance(value, list):
        return [interpolate(v) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v) for k, v in value.items()}
    return value


COMPOSE = interpolate(yaml.safe_load((ROOT / "compose.yaml").read_text()))
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
ENV_SERVICES = {name: s for name, s in SERVICES.items() if name != GATEWAY}


def dockerfile_stages() -> dict[str, str]:
    """Stage name -> its lines (``FROM parent AS name`` up to the next ``FROM``)."""
    stages = re.split(r"^FROM ", DOCKERFILE, flags=re.M)[1:]
    return {re.match(r"\S+ AS (\S+)", stage).group(1): stage for stage in stages}


def parent_of(stage: str) -> str:
    return stage.split(None, 1)[0]


def parse_cli(argv: list[str], environment: dict[str, str]) -> tuple[str, dict[str, Any]]:
    """Parse ``agentgym ARGS`` with the real command tree, as the container would (its
    environment variables included), without running it: (subcommand, parsed parameters)."""
    assert argv[0] == "agentgym", argv
    root = typer.main.get_command(app)
    with root.make_context("agentgym", [argv[1]], resilient_parsing=True) as parent:
        command = root.get_command(parent, argv[1])
        assert command is not None, f"no subcommand {argv[1]!r}"
        saved = dict(os.environ)
        os.environ.update(environment)
        try:
            context = command.make_context(argv[1], list(argv[2:]), parent=parent)
            return context.command.name, context.params
        finally:
            os.environ.clear()
            os.environ.update(saved)


def port_of(service: dict[str, Any]) -> int:
    return int(service["environment"]["AGENTGYM_PORT"])


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_service_command_is_a_real_cli_invocation(name: str) -> None:
    service = SERVICES[name]
    command, params = parse_cli(service["command"], service.get("environment", {}))
    assert params["port"] == port_of(service)
    assert params["host"] == "0.0.0.0"  # reachable from the other containers
    if name == GATEWAY:
        assert command == "gateway"
    else:
        assert command == "serve" and params["env"] == name
        registry.resolve(name)


def test_a_wrong_option_would_fail_the_check() -> None:
    with pytest.raises(Exception, match="No such option"):
        parse_cli(["agentgym", "serve", "choice", "--no-such-option", "1"], {})
    with pytest.raises(typer.BadParameter):
        parse_cli(["agentgym", "serve", "choice", "--max-sessions", "many"], {})


def test_every_registered_env_has_a_server() -> None:
    assert set(ENV_SERVICES) == set(registry.names())


def test_ports_are_unique_and_published_where_the_server_listens() -> None:
    container_ports = [port_of(s) for s in SERVICES.values()]
    assert len(set(container_ports)) == len(container_ports)
    host_ports = []
    for service in SERVICES.values():
        [published] = service["ports"]
        _bind, host_port, container_port = published.split(":")
        assert int(container_port) == port_of(service)
        host_ports.append(int(host_port))
    assert len(set(host_ports)) == len(host_ports)


def test_the_gateway_waits_for_and_routes_to_every_env_server() -> None:
    gateway = SERVICES[GATEWAY]
    assert gateway["depends_on"] == {name: {"condition": "service_healthy"} for name in ENV_SERVICES}
    command = gateway["command"]
    replicas = [command[i + 1] for i, arg in enumerate(command) if arg == "--replica"]
    expected = [f"{name}=http://{name}:{port_of(s)}" for name, s in ENV_SERVICES.items()]
    assert sorted(replicas) == sorted(expected)


def test_every_service_has_a_healthcheck_and_env_servers_share_the_cache_volume() -> None:
    for name, service in SERVICES.items():
        assert service["healthcheck"]["test"][0] == "CMD", name
    for service in ENV_SERVICES.values():
        assert "agentgym-cache:/cache" in service["volumes"]
    assert "agentgym-cache" in COMPOSE["volumes"]
    assert "AGENTGYM_CACHE=/cache" in DOCKERFILE


def healthcheck_of_dockerfile() -> list[str]:
    line = re.search(r"^\s+CMD (\[.*\])$", DOCKERFILE.split("HEALTHCHECK", 1)[1], re.M).group(1)
    return json.loads(line)


def test_the_healthchecks_pass_against_a_live_server_and_fail_without_one() -> None:
    compose_check = SERVICES["choice"]["healthcheck"]["test"][1:]
    assert compose_check == healthcheck_of_dockerfile()
    with serve_in_thread(ServerConfig(env="choice")) as url:
        port = url.rsplit(":", 1)[1]
        alive = subprocess.run(compose_check, env={**os.environ, "AGENTGYM_PORT": port}, capture_output=True)
        assert alive.returncode == 0, alive.stderr
    dead = subprocess.run(compose_check, env={**os.environ, "AGENTGYM_PORT": port}, capture_output=True)
    assert dead.returncode != 0


def test_image_targets_exist_install_only_their_extra_and_run_as_non_root() -> None:
    stages = dockerfile_stages()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    targets = {service["build"]["target"] for service in SERVICES.values()}
    for target in targets:
        final, venv = stages[target], stages[f"{target}-venv"]
        # the image is base + its venv: no compiler, no pip install of its own
        assert parent_of(final) == "base", target
        assert f"COPY --from={target}-venv /opt/venv /opt/venv" in final, target
        assert "pip install" not in final and "build-essential" not in final, target
        assert re.search(r"^USER agentgym$", final, re.M), f"{target} runs as root"
        # its venv stage has the compiler (builder) and installs the package with its extra only
        assert parent_of(venv) == "builder", target
        installs = re.findall(r'pip install "?\.(\[[\w,-]+\])?', venv)
        assert installs == ["" if target == "core" else f"[{target}]"], (target, installs)
        assert target == "core" or target in extras
    assert "pip install" not in stages["base"] + stages["builder"]  # dependencies belong to each venv
    assert "build-essential" in stages["builder"]
    assert re.search(r"^HEALTHCHECK ", stages["base"], re.M)
