"""Prometheus metrics of one env server (``GET /metrics``).

Each app gets its own registry, so several servers in one process (tests, the gateway)
never share counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from agentgym.servers.sessions import SessionManager

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServerMetrics:
    def __init__(self, env_name: str, sessions: SessionManager) -> None:
        self.registry = CollectorRegistry()
        labels = {"env": env_name}
        self.requests = Counter(
            "agentgym_http_requests",
            "HTTP requests by route and status",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "agentgym_http_request_seconds",
            "Request latency by route",
            ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        """Each label set's counter and histogram: route templates, standard methods and
        statuses, a bounded set."""
        self.episodes = Counter(
            "agentgym_episodes_finished",
            "Episodes that ended, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self._gauge("agentgym_sessions_active", "Live sessions", labels, lambda: len(sessions))
        self._gauge("agentgym_sessions_capacity", "Session capacity", labels, lambda: sessions.max_sessions)
        for name in ("created", "closed", "expired", "rejected", "engine_errors"):
            self._gauge(
                f"agentgym_sessions_{name}",
                f"Sessions {name.replace('_', ' ')} since start",
                labels,
                lambda name=name: getattr(sessions.stats, name),
            )

        self._gauge(
            "agentgym_engine_workers",
            "Live engine worker processes",
            labels,
            lambda: len(sessions.host.pids()),
        )
        self._gauge(
            "agentgym_engine_workers_replaced",
            "Engine worker processes replaced after they died, since start",
            labels,
            lambda: sessions.host.replaced,
        )

    def _gauge(self, name: str, doc: str, labels: dict[str, str], read: Callable[[], float]) -> None:
        gauge = Gauge(name, doc, list(labels), registry=self.registry)
        gauge.labels(**labels).set_function(read)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        key = (route, method, status)
        children = self._request_children.get(key)
        if children is None:  # prometheus_client's labels() checks and locks on every call
            children = self.requests.labels(route, method, str(status)), self.latency.labels(route)
            self._request_children[key] = children
        children[0].inc()
        children[1].observe(seconds)

    def episode_finished(self, terminated: bool, success: bool) -> None:
        outcome = "success" if success else ("failure" if terminated else "truncated")
        self.episodes.labels(outcome).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
