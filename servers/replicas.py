"""The replicas behind the gateway: its config, each replica's last health report, and the
fleet that picks a replica for a new session (least loaded, round-robin on ties)."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import logging
from dataclasses import dataclass, field
from typing import Any

import httpx

from agentgym.contract.errors import UnknownEnv, UnknownSession

log = logging.getLogger(__name__)


@dataclass
class GatewayConfig:
    """Everything the gateway needs. Every field has a flag on ``agentgym gateway``."""

    replicas: dict[str, list[str]]
    """Env name -> base URLs of its replicas (env servers of that env)."""
    health_interval: float = 2.0
    """Seconds between two polls of every replica's ``/health``."""
    timeout: float = 120.0
    """Seconds a forwarded request may take (a slow engine step included)."""
    max_connections: int = 512
    """Connections the gateway keeps open to the replicas, in all."""
    max_body_bytes: int = 64 * 1024
    """Larger request bodies get 413 at the gateway, before anything is forwarded (the
    env servers' default limit too)."""
    token: str | None = None
    """The replicas' bearer token: ``GET /health`` lists the replicas' URLs only to a request
    bearing it (never when it is unset or empty). Every other request carries its own token
    to the replica."""


@dataclass
class Replica:
    """One env server behind the gateway, and what its last ``/health`` said."""

    env: str
    url: str
    index: int
    """Position among the env's replicas (used by the compat id mapping)."""
    healthy: bool = False
    sessions: int = 0
    capacity: int = 0
    opening: int = 0
    """Creates sent to it and not answered yet: a burst of concurrent creates must spread
    before any of them is counted in ``sessions``."""
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self.key = hashlib.sha1(self.url.encode()).hexdigest()[:8]

    @property
    def load(self) -> float:
        return (self.sessions + self.opening) / self.capacity if self.capacity else float(self.opening)

    def report(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "healthy": self.healthy,
            "sessions": self.sessions,
            "capacity": self.capacity,
        }

    def __str__(self) -> str:
        """How error messages name it: by key, since its URL is internal."""
        return f"replica {self.key} of {self.env!r}"


class Fleet:
    """The replicas of every env: lookup, choice of a replica for new sessions, health."""

    def __init__(self, replicas: dict[str, list[str]]) -> None:
        if not replicas or not all(replicas.values()):
            raise ValueError("the gateway needs at least one replica URL per env")
        self.envs = {
            env: [Replica(env, url, i) for i, url in enumerate(urls)] for env, urls in replicas.items()
        }
        self._turns = itertools.count()

    def replicas(self, env: str) -> list[Replica]:
        if env not in self.envs:
            raise UnknownEnv(f"the gateway serves no env {env!r}; it serves {sorted(self.envs)}")
        return self.envs[env]

    def by_key(self, env: str, key: str) -> Replica:
        for replica in self.replicas(env):
            if replica.key == key:
                return replica
        raise UnknownSession(f"no replica {key!r} of {env!r} behind this gateway (unknown session id)")

    def candidates(self, env: str) -> list[Replica]:
        """Healthy replicas, least loaded first; equal loads take turns (round-robin)."""
        replicas = self.replicas(env)
        turn = next(self._turns)
        healthy = [r for r in replicas if r.healthy]
        return sorted(healthy, key=lambda r: (r.load, (r.index - turn) % len(replicas)))

    async def poll(self, http: httpx.AsyncClient) -> None:
        """Ask every replica's ``/health`` at once and record the answers."""
        everyone = [r for replicas in self.envs.values() for r in replicas]
        await asyncio.gather(*(_poll_one(http, r) for r in everyone))

    def env_report(self, env: str, members: bool = False) -> dict[str, Any]:
        """One env's replica count, healthy count, sessions and capacity (of healthy
        replicas), with ``members`` each replica's report (its URL included);
        :class:`UnknownEnv` for an env not served."""
        replicas = self.replicas(env)
        healthy = [r for r in replicas if r.healthy]
        report = {
            "replicas": len(replicas),
            "healthy": len(healthy),
            "sessions": sum(r.sessions for r in healthy),
            "capacity": sum(r.capacity for r in healthy),
        }
        return report | {"members": [r.report() for r in replicas]} if members else report

    def report(self, members: bool = False) -> dict[str, Any]:
        """Per env: replica count, healthy count, sessions and capacity (of healthy replicas),
        and with ``members`` each replica's report; ``status`` is ``ok`` when every replica
        is healthy, else ``degraded``."""
        envs = {env: self.env_report(env, members) for env in self.envs}
        status = "ok" if all(e["healthy"] == e["replicas"] for e in envs.values()) else "degraded"
        return {"status": status, "envs": envs}


async def _poll_one(http: httpx.AsyncClient, replica: Replica) -> None:
    try:
        response = await http.get(f"{replica.url}/health", timeout=5.0)
        health = response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        health = {}
    if health and health.get("env") != replica.env:
        log.warning("replica %s serves env %r, not %r: ignored", replica.url, health.get("env"), replica.env)
        health = {}
    replica.healthy = bool(health)
    replica.sessions, replica.capacity = int(health.get("sessions", 0)), int(health.get("capacity", 0))
