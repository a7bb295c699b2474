"""Docs that are generated must match what the code generates."""

from pathlib import Path

from agentgym.servers.apidoc import render
from agentgym.servers.app import ServerConfig, create_app

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_is_current() -> None:
    expected = render(create_app(ServerConfig(env="textworld")).openapi())
    actual = (ROOT / "docs" / "api.md").read_text()
    assert actual == expected, "docs/api.md is stale: run `python -m agentgym.servers.apidoc > docs/api.md`"
