"""The viewer's web app: a JSON API over an :class:`EpisodeIndex` plus the static page.

Routes (all GET):

* ``/`` – the page (``static/index.html``; every asset is served from the package, no CDN).
* ``/health`` – liveness, as on the env servers.
* ``/api/info`` – what is being viewed: root, filter menus, whether there are metrics, the
  dashboard panels (those of ``agentgym plot``).
* ``/api/episodes?offset&limit&env&task&success&min_reward&max_reward&step&source`` – one
  page of episode summaries, filtered server-side; 400 on a malformed parameter.
* ``/api/episodes/{id}`` – one episode: turns and token runs (404 for an unknown id).
* ``/api/compare?a=ID&b=ID`` – two episodes, for the side-by-side view.
* ``/api/metrics?since=N`` – ``metrics.jsonl`` rows from row N on (the page polls it).

Errors are ``{"error": {"code", "message"}}`` like the env servers'.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware

from agentgym.contract.errors import AgentGymError, NotFound
from agentgym.records.curves import BY_PHASE, PANELS, RATES, with_intervals
from agentgym.viewer.episode import episode_view
from agentgym.viewer.index import EpisodeFilter, EpisodeIndex, page, read_metrics
from agentgym.viewer.tokens import TokenDecoder, load_decoder

STATIC = Path(__file__).parent / "static"
MAX_LIMIT = 500
"""Largest page: the list renders a page at a time, so the browser never holds 10k rows."""


class BadRequest(AgentGymError):
    """A query parameter that does not parse."""

    status = 400
    code = "bad_request"


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def viewer_hosts(bind: str) -> list[str]:
    """Host headers the viewer answers when bound to ``bind``: the loopback names and
    ``bind`` itself; any name when bound to every interface (0.0.0.0 or ::), which shares
    the viewer on purpose and cannot know the names it is reached by."""
    if bind in ("0.0.0.0", "::", ""):
        return ["*"]
    return list(dict.fromkeys([*LOOPBACK_HOSTS, bind]))


def create_app(
    path: str | Path,
    *,
    tokenizer: str | None = None,
    decoder: TokenDecoder | None = None,
    poll_s: float = 3.0,
    allowed_hosts: Sequence[str] | None = None,
) -> FastAPI:
    """The viewer for a run folder or a trajectory JSONL file. Raises
    :class:`~agentgym.viewer.index.NotTrajectoryFile` when ``path`` is missing or is a file
    that is not trajectory JSONL. ``decoder`` (tests) or ``tokenizer`` (a model spec) choose
    the token text; by default it is looked up per :mod:`agentgym.viewer.tokens`.
    ``poll_s`` is how often the page re-reads metrics and the episode count.
    ``allowed_hosts`` (``agentgym view`` passes :func:`viewer_hosts`) refuses requests whose
    Host header names another site with 400: a page on evil.example that re-points its
    DNS name at 127.0.0.1 (DNS rebinding) must not read the run; ``None`` checks nothing."""
    index = EpisodeIndex(path)
    app = FastAPI(title="AgentGym viewer", docs_url=None, redoc_url=None)
    if allowed_hosts is not None:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    app.state.index = index
    specs = [s for s in (tokenizer, _config_model(index.root)) if s]

    def decoder_for(record: dict[str, Any]) -> TokenDecoder | None:
        if decoder is not None or not record.get("token_ids"):
            return decoder
        for spec in [*specs, str(record.get("policy", ""))]:
            found = load_decoder(spec) if spec else None
            if found is not None:
                return found
        return None

    def view(episode_id: str) -> dict[str, Any]:
        number = _parse(episode_id, int, "episode id")
        index.refresh()
        try:
            summary, record = index.episode(number)
        except KeyError:
            raise NotFound(f"no episode {episode_id} (or its file was rewritten since)") from None
        return episode_view(asdict(summary), record, decoder_for(record))

    @app.exception_handler(AgentGymError)
    async def error(_: Request, exc: AgentGymError) -> JSONResponse:
        return JSONResponse(exc.to_body(), status_code=exc.status)

    @app.get("/", include_in_schema=False)
    def home() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @app.get("/health", include_in_schema=False)
    def health() -> dict[str, str]:
        return {"status": "ok"}  # what the project's launchers poll before using a server

    @app.get("/api/info")
    def info() -> dict[str, Any]:
        index.refresh()
        metrics = index.metrics_path
        return {
            "root": str(index.root),
            "run": index.root.is_dir(),
            "has_metrics": bool(metrics and metrics.exists()),
            "poll_s": poll_s,
            "panels": PANELS,  # the dashboard draws what `agentgym plot` draws
            "rate_keys": sorted(RATES),  # drawn on a 0..1 axis
            "phase_keys": sorted(BY_PHASE),  # one line per training phase (bc, rl, ...)
            **index.facets(),
        }

    @app.get("/api/episodes")
    def episodes(request: Request) -> dict[str, Any]:
        query = request.query_params
        offset = _parse(query.get("offset", "0"), int, "offset")
        limit = _parse(query.get("limit", "50"), int, "limit")
        if offset < 0 or not 1 <= limit <= MAX_LIMIT:
            raise BadRequest(f"offset must be >= 0 and limit in 1..{MAX_LIMIT}")
        index.refresh()
        return page(index, parse_filter(dict(query)), offset, limit)

    @app.get("/api/episodes/{episode_id}")
    def episode(episode_id: str) -> dict[str, Any]:
        return view(episode_id)

    @app.get("/api/compare")
    def compare(a: str = "", b: str = "") -> dict[str, Any]:
        if not a or not b:
            raise BadRequest("compare needs two episode ids: ?a=ID&b=ID")
        return {"a": view(a), "b": view(b)}

    @app.get("/api/metrics")
    def metrics(since: str = "0") -> dict[str, Any]:
        start = _parse(since, int, "since")
        rows = read_metrics(index.metrics_path, max(start, 0))
        return {"rows": [with_intervals(row) for row in rows], "next": max(start, 0) + len(rows)}

    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


def parse_filter(query: dict[str, str]) -> EpisodeFilter:
    """An :class:`EpisodeFilter` from query parameters; empty values mean "any";
    :class:`BadRequest` for a value that does not parse (``success`` is true/false)."""
    given = {k: v for k, v in query.items() if v != ""}
    success = given.get("success")
    if success is not None and success not in ("true", "false"):
        raise BadRequest(f"success must be true or false, got {success!r}")
    return EpisodeFilter(
        env=given.get("env"),
        task=given.get("task"),
        success=None if success is None else success == "true",
        min_reward=_optional(given, "min_reward", float),
        max_reward=_optional(given, "max_reward", float),
        step=_optional(given, "step", int),
        source=given.get("source"),
    )


def _optional(query: dict[str, str], key: str, kind: type) -> Any:
    return _parse(query[key], kind, key) if key in query else None


def _parse(value: str, kind: type, name: str) -> Any:
    try:
        return kind(value)
    except ValueError:
        raise BadRequest(
            f"{name} must be {'an integer' if kind is int else 'a number'}, got {value!r}"
        ) from None


def _config_model(root: Path) -> str | None:
    """The ``model`` of a run folder's ``config.yaml``, the tokenizer its rollouts used."""
    config = root / "config.yaml" if root.is_dir() else None
    if config is None or not config.is_file():
        return None
    try:
        loaded = yaml.safe_load(config.read_text())
    except yaml.YAMLError:
        return None
    return str(loaded["model"]) if isinstance(loaded, dict) and loaded.get("model") else None
