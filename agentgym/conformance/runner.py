"""``agentgym check-env URL``: wire API v1 conformance checks for any env server.

The HTTP counterpart of Gymnasium's ``utils/env_checker.py``: :func:`run_checks` plays
the contract of wire API v1 (docs/api.md) against a live server written in any language.
It speaks raw HTTP through ``httpx`` rather than :class:`agentgym.clients.env_client.EnvClient`, so a
client that papers over a protocol slip cannot hide it.

Contract of the checker itself:

* Every check runs in isolation: a failure is recorded and the next check still runs.
  A check whose prerequisite failed is reported as failed with ``skipped: needs X``.
* An unreachable server yields exactly one failed result, never a traceback.
* Every session the checker opens (v1 or AgentGym-compatible) is closed before it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from agentgym.conformance.checks import CHECKS, TIMEOUT_S, Check, CheckFailed, CheckRun


@dataclass(frozen=True)
class CheckResult:
    """One line of the report: ``detail`` says what was seen (why it failed, or a summary)."""

    name: str
    passed: bool
    detail: str = ""


# ----- running ---------------------------------------------------------------------


def run_checks(url: str, *, token: str | None = None, task_id: str | None = None) -> list[CheckResult]:
    """Check the server at ``url`` against wire API v1; one result per check, in order.

    ``token`` is sent as a bearer token; ``task_id`` picks the task to play (default: the
    first task of the ``test`` split, else of the first split).
    """
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=TIMEOUT_S)
    except httpx.InvalidURL as exc:
        return [CheckResult("server reachable", False, f"bad URL {url!r}: {exc}")]
    with http:
        reachable = _reachable(http, url)
        if not reachable.passed:
            return [reachable]
        run = CheckRun(http, token, task_id)
        try:
            return [reachable, *_run_all(run)]
        finally:
            run.close_all()


def _reachable(http: httpx.Client, url: str) -> CheckResult:
    try:
        response = http.get("/health")
    except httpx.HTTPError as exc:
        return CheckResult("server reachable", False, f"cannot reach {url}: {type(exc).__name__}: {exc}")
    return CheckResult("server reachable", True, f"GET /health answered {response.status_code}")


def _run_all(run: CheckRun) -> list[CheckResult]:
    results: dict[str, CheckResult] = {}
    for spec in CHECKS:
        if not spec.applies(run):
            continue
        missing = [name for name in spec.needs if not results[name].passed]
        if missing:
            results[spec.name] = CheckResult(spec.name, False, f"skipped: needs {', '.join(missing)}")
        else:
            results[spec.name] = _run_one(spec, run)
    return list(results.values())


def _run_one(spec: Check, run: CheckRun) -> CheckResult:
    try:
        detail = spec.run(run)
    except CheckFailed as exc:
        return CheckResult(spec.name, False, str(exc))
    except httpx.HTTPError as exc:
        return CheckResult(spec.name, False, f"HTTP failure: {type(exc).__name__}: {exc}")
    except Exception as exc:
        # A reply shaped so oddly that reading it raised (a list where an object belongs,
        # a missing key): that is a broken contract too, and must not stop later checks.
        return CheckResult(spec.name, False, f"unreadable reply: {type(exc).__name__}: {exc}")
    return CheckResult(spec.name, True, detail)
