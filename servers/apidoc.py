"""Render the wire API reference (docs/api.md) from the server's OpenAPI spec.

`agentgym generate` writes it (with the other generated files); a test fails when
docs/api.md no longer matches, so the reference cannot drift.
"""

from __future__ import annotations

from typing import Any

from agentgym.contract.errors import ERRORS_BY_CODE
from agentgym.servers.app import ServerConfig, create_app

HEADER = """\
# Wire API v1 reference

Generated from the OpenAPI spec by `agentgym generate`; do not edit by hand. Every env server serves the live spec at `/openapi.json` and a browsable UI at
`/docs`. JSON in, JSON out; request bodies reject unknown fields (422).
"""


INPUT_RULES = """\
## Input rules

Requests are checked before any engine sees them; a refused request changes nothing (the
session, its turn and the engine-error count stay as they were). An action is normalised
(Unicode NFC, or NFKC where the engine needs it) and stripped, then refused with 400
`invalid_action` when it is empty, longer than the env's `max_action_chars` (`/metadata`),
contains a control character other than tab/newline/carriage return or a lone surrogate,
or breaks the env's own rules (textworld: printable ASCII only, no backslash, 198 bytes at
most; see each env's envs/NAME/README.md). Reset options are type-checked with 422 `validation_error`:
`options.max_turns` is null or an integer 0..100000 (0 and null mean the env's default;
an integral float such as `5.0` counts as an integer), `options.split` a string,
`options.index` an integer >= 0, plus each env's own options; all options together are
nested at most 16 deep and hold at most 1000 values and 16384 characters. 503
`engine_failed` means only that the engine itself failed (the session is closed); it is
never the answer to a bad request.

A request head (request line and header fields) over 16 KiB or 100 fields is 431
`headers_too_large`; a head or body that has not arrived within 30 s (a body shorter than
its `Content-Length`) is 408 `request_timeout`, and the connection is closed
(`ServerConfig.max_header_bytes`, `max_header_fields`, `request_timeout`). With
`ServerConfig.max_sessions_per_client`, a client that holds that many sessions gets 429
`at_capacity` for another, by any route.

AgentGym-compatible integer ids (`/create`'s answer) are random in [1, 2^53) and name only
sessions created by `/create`: sessions of wire API v1, OpenEnv and `/ws` have none, and
an id that names no live session (never given, closed, or from before a restart) is 404
`session_not_found`.
"""


def render(spec: dict[str, Any]) -> str:
    lines = [
        HEADER,
        "## Errors",
        "",
        'Every error is `{"error": {"code": ..., "message": ...}}`.',
        "",
        "| status | code | meaning |",
        "| --- | --- | --- |",
    ]
    for code, cls in sorted(ERRORS_BY_CODE.items(), key=lambda item: (item[1].status, item[0])):
        meaning = " ".join((cls.__doc__ or code.replace("_", " ")).split())
        lines.append(f"| {cls.status} | `{code}` | {meaning} |")
    lines.append(
        "\n429 answers carry `Retry-After` (seconds). 401 only when the server runs with `--token`.\n"
    )
    lines.append(INPUT_RULES)
    for tag in ("v1", "agentgym-compat"):
        lines.append("## Routes: " + ("wire API v1" if tag == "v1" else "AgentGym-compatible"))
        lines.append("")
        for path, methods in spec["paths"].items():
            for method, operation in methods.items():
                if tag in operation.get("tags", []):
                    lines += _operation(spec, method, path, operation)
    lines.append("## Schemas\n")
    for name, schema in spec["components"]["schemas"].items():
        if name in ("HTTPValidationError", "ValidationError"):
            continue
        lines += _schema(name, schema)
    return "\n".join(lines).rstrip() + "\n"


def _operation(spec: dict[str, Any], method: str, path: str, operation: dict[str, Any]) -> list[str]:
    lines = [f"### `{method.upper()} {path}`", ""]
    if operation.get("description"):
        lines += [" ".join(operation["description"].split()), ""]
    params = [p for p in operation.get("parameters", []) if p["in"] == "query"]
    if params:
        lines.append(
            "Query: " + ", ".join(f"`{p['name']}` ({_type(spec, p['schema'])})" for p in params) + "."
        )
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
    if body:
        lines.append(f"Body: {_type(spec, body)}.")
    ok = {code: r for code, r in operation["responses"].items() if code.startswith("2")}
    for code, response in ok.items():
        schema = response.get("content", {}).get("application/json", {}).get("schema")
        lines.append(f"Returns {code}" + (f": {_type(spec, schema)}." if schema else "."))
    return [*lines, ""]


def _schema(name: str, schema: dict[str, Any]) -> list[str]:
    lines = [f"### {name}", ""]
    if schema.get("description"):
        lines += [" ".join(schema["description"].split()), ""]
    required = set(schema.get("required", []))
    lines += ["| field | type | required |", "| --- | --- | --- |"]
    for field, prop in schema.get("properties", {}).items():
        lines.append(f"| `{field}` | {_type({}, prop)} | {'yes' if field in required else 'no'} |")
    return [*lines, ""]


def _type(spec: dict[str, Any], schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return f"[{schema['$ref'].rsplit('/', 1)[-1]}](#{schema['$ref'].rsplit('/', 1)[-1].lower()})"
    if "anyOf" in schema:
        return " or ".join(_type(spec, option) for option in schema["anyOf"])
    if schema.get("type") == "array":
        return f"array of {_type(spec, schema.get('items', {}))}"
    if schema.get("type") == "object" and isinstance(schema.get("additionalProperties"), dict):
        return f"object of {_type(spec, schema['additionalProperties'])}"
    return str(schema.get("type", "any"))


def api_reference() -> str:
    """docs/api.md: the reference of a textworld server's routes (every env serves the same)."""
    return render(create_app(ServerConfig(env="textworld")).openapi())
