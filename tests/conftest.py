"""Shared fixtures: a per-run cache folder and live env servers on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from agentgym.servers.app import ServerConfig
from agentgym.servers.launcher import serve_in_thread


@pytest.fixture(scope="session", autouse=True)
def agentgym_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Generated games etc. go to one cache per test run (shared by servers and subprocesses)."""
    path = os.environ.get("AGENTGYM_TEST_CACHE") or str(tmp_path_factory.mktemp("agentgym-cache"))
    old = os.environ.get("AGENTGYM_CACHE")
    os.environ["AGENTGYM_CACHE"] = path
    yield path
    if old is None:
        os.environ.pop("AGENTGYM_CACHE", None)
    else:
        os.environ["AGENTGYM_CACHE"] = old


@pytest.fixture(scope="session")
def textworld_url(agentgym_cache: str) -> Iterator[str]:
    """A real textworld server on loopback, shared by the tests that only read or use own sessions."""
    with serve_in_thread(ServerConfig(env="textworld", max_sessions=128)) as url:
        yield url
