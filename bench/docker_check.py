"""Docker for real (issue 20 item 4): build every image of compose.yaml, bring the fleet up,
check every env through the gateway, tear it down; prints image sizes and cold-start times.

    python bench/docker_check.py [--compose "docker compose"] [--no-build] [--keep] [--json out.json]

Steps: ``COMPOSE build`` (timed); ``COMPOSE up -d envs`` under a project name of its own on
free host ports (GATEWAY_PORT, <ENV>_PORT), so a fleet already running on 8100-8106 is left
alone; every env server's published ``/health`` and the gateway's are polled from the moment
``up`` starts (cold start = seconds from ``up`` until it answers, and from its container's
start); then through the gateway, per env: ``agentgym check-env URL/envs/ENV`` and one expert
episode on the first test task over the Python client; WebShop's browser mode once inside
its container; then ``COMPOSE down -v`` (the cache volume too, so the next run starts cold). Exit 1 if any check fails.
Not part of ``make test`` (minutes; needs a Docker engine): ``make docker-check``. Figures go
to bench/RESULTS.md by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from agentgym.clients.env_client import EnvClient
from agentgym.servers.launcher import free_port

ROOT = Path(__file__).resolve().parent.parent
GATEWAY = "envs"
PROJECT = "agentgym-check"
AGENTGYM = str(Path(sys.executable).with_name("agentgym"))
MAX_EXPERT_TURNS = 100
BROWSER_SMOKE = (
    "from agentgym.envs.webshop.env import WebShopEnv; "
    "env = WebShopEnv(mode='browser', n_products=100, n_train=1, n_test=1, cache_dir='/tmp/smoke'); "
    "print(env.reset(task_id='test/0')[0][:60])"
)
"""WebShop's browser mode (Playwright + chromium) on a tiny catalog inside the webshop container:
the fleet serves text mode, so nothing else would notice a browser that cannot start."""
HEALTH_TIMEOUT = 900.0
"""Seconds the fleet may take to become healthy (sciworld's JVM and textworld's first
games on 2 busy cores take minutes)."""


@dataclass
class Figures:
    service: str
    image: str
    image_mb: float = 0.0
    ready_s: float | None = None
    """Seconds from ``compose up`` until the service's ``/health`` answered."""
    boot_s: float | None = None
    """Seconds from its container's start until ``/health`` answered."""
    check_env: bool | None = None
    expert_success: bool | None = None
    expert_turns: int | None = None


def compose_command(choice: str | None) -> list[str]:
    """``docker compose`` (v2) where it exists, else Debian's ``docker-compose`` (v1)."""
    if choice:
        return shlex.split(choice)
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
    return ["docker", "compose"] if probe.returncode == 0 else ["docker-compose"]


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print("+", shlex.join(command), flush=True)
    return subprocess.run(command, cwd=ROOT, check=True, **kwargs)


def host_ports(services: dict[str, dict]) -> dict[str, str]:
    """Free host ports for every published port: GATEWAY_PORT and <ENV>_PORT."""
    names = ["GATEWAY_PORT" if name == GATEWAY else f"{name.upper()}_PORT" for name in services]
    return {name: str(free_port()) for name in names}


def resolved_services(compose: list[str]) -> dict[str, dict]:
    """The services as compose resolves them (ports, images) in this environment."""
    config = run([*compose, "config"], capture_output=True, text=True).stdout
    return yaml.safe_load(config)["services"]


def published_port(service: dict) -> int:
    """The host port of a service's only published port (v1 prints a string, v2 a mapping)."""
    [port] = service["ports"]
    if isinstance(port, dict):
        return int(port["published"])
    return int(str(port).split(":")[-2])


def image_mb(image: str) -> float:
    size = run(["docker", "image", "inspect", "--format", "{{.Size}}", image], capture_output=True, text=True)
    return round(int(size.stdout) / 1e6, 1)


def container_started_at(compose: list[str], service: str) -> float:
    """Epoch seconds when the service's container started (Docker's RFC 3339, nanoseconds cut)."""
    container = run([*compose, "ps", "-q", service], capture_output=True, text=True).stdout.split()[0]
    started = run(
        ["docker", "inspect", "--format", "{{.State.StartedAt}}", container], capture_output=True, text=True
    ).stdout.strip()
    day, _, fraction = started.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{day}.{fraction[:6] or 0}+00:00").timestamp()


def poll_health(url: str, deadline: float, stop: threading.Event) -> float | None:
    """Epoch seconds of the first 200 from ``url/health``; None past the deadline or once stopped."""
    while time.time() < deadline and not stop.is_set():
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.time()
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    return None


def bring_up(compose: list[str], services: dict[str, dict], figures: dict[str, Figures]) -> bool:
    """``up -d envs`` while polling every service's /health; fills ready_s and boot_s."""
    healthy_at: dict[str, float | None] = {}
    start, failed = time.time(), threading.Event()

    def watch(name: str) -> None:
        url = f"http://127.0.0.1:{published_port(services[name])}"
        healthy_at[name] = poll_health(url, start + HEALTH_TIMEOUT, failed)

    watchers = [threading.Thread(target=watch, args=(name,)) for name in services]
    for watcher in watchers:
        watcher.start()
    up = subprocess.run([*compose, "up", "-d", "--no-build", GATEWAY], cwd=ROOT)
    if up.returncode != 0:  # e.g. a server never became healthy: stop waiting for the rest
        failed.set()
    for watcher in watchers:
        watcher.join()
    for name, at in healthy_at.items():
        if at is not None:
            figures[name].ready_s = round(at - start, 1)
            figures[name].boot_s = round(at - container_started_at(compose, name), 1)
    return up.returncode == 0 and all(at is not None for at in healthy_at.values())


def check_env(url: str) -> bool:
    completed = subprocess.run([AGENTGYM, "check-env", url], capture_output=True, text=True)
    print(completed.stdout.rstrip(), completed.stderr.rstrip(), sep="\n", flush=True)
    return completed.returncode == 0


def expert_episode(url: str) -> tuple[bool, int]:
    """One episode of the first test task, each turn sending ``info["expert_action"]`` as is
    (eval's reply formats would reparse multi-line expert answers): (success, turns)."""
    with EnvClient(url, timeout=300) as client:
        created = client.create(split="test", index=0)
        info, turns = created.info, 0
        try:
            while isinstance(info.get("expert_action"), str) and turns < MAX_EXPERT_TURNS:
                result = client.step(created.session_id, info["expert_action"])
                info, turns = result.info, turns + 1
                if result.terminated or result.truncated:
                    break
        finally:
            client.delete(created.session_id)
    return bool(info.get("success")), turns


def webshop_browser_mode(compose: list[str]) -> bool:
    command = [*compose, "exec", "-T", "webshop", "python", "-c", BROWSER_SMOKE]
    completed = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    print("webshop browser mode:", completed.stdout.strip() or completed.stderr[-1000:], flush=True)
    return completed.returncode == 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--compose", help='Compose command (default: "docker compose" if present, else docker-compose).'
    )
    parser.add_argument("--no-build", action="store_true", help="Use the images already built.")
    parser.add_argument("--keep", action="store_true", help="Leave the fleet running.")
    parser.add_argument("--json", help="Also write the figures here.")
    args = parser.parse_args()
    # The classic builder needs no buildx component and pulls no frontend image (no Docker Hub
    # here); export DOCKER_BUILDKIT=1 to use BuildKit instead.
    os.environ.setdefault("DOCKER_BUILDKIT", "0")
    os.environ["COMPOSE_PROJECT_NAME"] = PROJECT
    compose = compose_command(args.compose)
    os.environ.update(host_ports(resolved_services(compose)))
    services = resolved_services(compose)
    figures = {name: Figures(name, service["image"]) for name, service in services.items()}

    build_s = 0.0
    if not args.no_build:
        start = time.monotonic()
        run([*compose, "build"])
        build_s = time.monotonic() - start
    for fig in figures.values():
        fig.image_mb = image_mb(fig.image)
    ok = False
    try:
        ok = bring_up(compose, services, figures)
        gateway = f"http://127.0.0.1:{published_port(services[GATEWAY])}"
        for env in (name for name in services if name != GATEWAY):
            url = f"{gateway}/envs/{env}"
            figures[env].check_env = check_env(url)
            figures[env].expert_success, figures[env].expert_turns = expert_episode(url)
        browser = webshop_browser_mode(compose)
        ok = (
            ok
            and browser
            and all(f.check_env and f.expert_success for f in figures.values() if f.service != GATEWAY)
        )
    finally:
        if not args.keep:
            run([*compose, "down", "-v"])
    report(compose, build_s, list(figures.values()), ok)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(f) for f in figures.values()], indent=2))
    return 0 if ok else 1


def report(compose: list[str], build_s: float, figures: list[Figures], ok: bool) -> None:
    print(f"\n{shlex.join(compose)} build: {build_s:.0f} s" if build_s else "\n(images already built)")
    print(f"{'service':10s} {'image':28s} {'MB':>7s} {'ready s':>8s} {'boot s':>7s}  check-env  expert")
    for f in figures:
        check = "-" if f.check_env is None else ("pass" if f.check_env else "FAIL")
        expert = (
            "-" if f.expert_success is None else f"{'won' if f.expert_success else 'LOST'} {f.expert_turns}t"
        )
        print(
            f"{f.service:10s} {f.image:28s} {f.image_mb:7.1f} {f.ready_s!s:>8s} {f.boot_s!s:>7s}  {check:9s}  {expert}"
        )
    print("all checks passed" if ok else "SOME CHECKS FAILED")


if __name__ == "__main__":
    sys.exit(main())
