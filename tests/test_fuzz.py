"""Issue 19 item 5: property-based fuzzing of every route of the env servers (wire API v1
and the AgentGym-compatible routes) and of the gateway.

Random Unicode (control characters and lone surrogates included), huge and non-finite
numbers, wrong types, unparseable bodies, deeply nested options, abusive headers and the
interpreter's meta-verbs go to each route. Properties: no 5xx but a documented engine
failure (503 ``engine_failed``), the server process stays alive, no file appears where it
was started, and a bystander session on the same server is untouched (still at its first
observation, whatever id the fuzzer tried) and still steps. Servers run as child
processes, so a crash is a failed assertion rather than a dead pytest. Examples per route are bounded
(``EXAMPLES``) to keep the file near a minute on two cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.servers.launcher import ServerProcess, start_gateway_process, start_server_process, wait_healthy
from conftest import engine_errors, send_raw

EXAMPLES = 25
"""Examples per route and server: enough to hit every kind of bad value a few times."""
TIMEOUT_S = 20.0
"""A reply this late means a hung engine (steps take milliseconds)."""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
HEADER_FUZZ = settings(FUZZ, suppress_health_check=[*FUZZ.suppress_health_check, HealthCheck.data_too_large])
"""A value over 16 KiB is the point of the header strategy."""

# ----- what is thrown ------------------------------------------------------------------

META_VERBS = ["save", "restore", "undo", "restart", "quit", "script", "unscript", "transcript"]
"""The interpreter's own verbs, which read or write files outside any session."""
any_char = st.characters(exclude_categories=())  # control characters and lone surrogates too
controls_among_letters = st.text(st.characters(max_codepoint=0x9F), min_size=2, max_size=12)
"""ASCII dense in C0/C1 controls: what made the Z-machine segfault ("\u00c5\u0015", "look\u000e")."""
texts = st.one_of(
    st.text(any_char, max_size=40),
    st.text(st.characters(max_codepoint=0x7F), max_size=40),
    controls_among_letters,
    st.sampled_from(["look", "go north", "blue", "\\hello", "The answer is 4", "train", "test", "boil/²"]),
    st.sampled_from(META_VERBS).map(lambda verb: f"look. {verb.upper()} on"),
    st.text(any_char, min_size=190, max_size=260),
)
numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 2**63, 10**4000]),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
KEYS = ["task_id", "split", "index", "seed", "options", "action", "id", "env_idx", "data_idx", "max_turns"]
objects = st.dictionaries(st.sampled_from(KEYS) | texts, json_values, max_size=4)
options = st.dictionaries(
    st.sampled_from(["max_turns", "split", "index", "simplifications"]), json_values, max_size=3
)

deep_options = st.builds(
    lambda depth, brackets: '{"options": ' + brackets[0] * depth + "1" + brackets[1] * depth + "}",
    st.integers(min_value=17, max_value=2000),
    st.sampled_from([('{"unknown": ', "}"), ("[", "]")]),
)
"""Options nested past the servers' bound (16 levels): a ~1 KB body once reached the engine."""
header_values = st.one_of(
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=40),
    st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=16_000, max_size=20_000),
).map(lambda text: text.encode("latin-1"))  # RFC 9110 field values: httpx refuses edge spaces
header_sets = st.one_of(
    st.dictionaries(
        st.sampled_from(["x-name", "x-a", "user-agent", "x-forwarded-for"]), header_values, max_size=3
    ),
    st.integers(min_value=90, max_value=120).map(lambda n: {f"x-{i}": b"v" for i in range(n)}),
)
"""Non-ASCII values, a value over 16 KiB, up to 120 fields: 431 past the bounds, else served."""


@st.composite
def bodies(draw: st.DrawFn, fields: dict[str, st.SearchStrategy]) -> str | bytes:
    """Mostly an object with the route's own fields (values fuzzed), sometimes any JSON
    value or raw bytes; huge numbers, NaN and Infinity written as Python's json writes them."""
    kind = draw(st.sampled_from(["fields", "fields", "fields", "object", "value", "bytes"]))
    if kind == "bytes":
        return draw(st.binary(max_size=64))
    if kind == "value":
        value = draw(json_values)
    elif kind == "object":
        value = draw(objects)
    else:
        value = {name: draw(strategy) for name, strategy in fields.items() if draw(st.booleans())}
    try:
        return json.dumps(value)
    except ValueError:  # an integer longer than Python prints: send it anyway
        return '{"seed": 1' + "0" * 5000 + "}"


# ----- the servers ----------------------------------------------------------------------


@dataclass
class Target:
    server: ServerProcess
    http: httpx.Client
    session: str
    """A live session of the fuzzed server, stepped with fuzzed actions."""
    bystander: dict
    """Another session, never fuzzed: it must still step at the end."""

    def check(self, method: str, path: str, body: str | bytes = b"", params: dict | None = None) -> dict:
        """Send one request and check the properties; the answer's JSON body."""
        if params:  # encoded by hand: httpx refuses lone surrogates, servers must not fail on them
            path += "?" + "&".join(f"{_quoted(key)}={_quoted(value)}" for key, value in params.items())
        status, answer = send_raw(self.http, method, path, body)
        assert status is not None, f"{method} {path} {body!r}: no answer (crashed or hung)"
        documented_failure = status == 503 and answer.get("error", {}).get("code") == "engine_failed"
        assert status < 500 or documented_failure, f"{method} {path} {body!r} -> {status} {answer}"
        assert self.server.process.poll() is None, f"{method} {path} {body!r} killed the server"
        return answer


def bystander_untouched(http: httpx.Client, bystander: dict, action: str) -> None:
    """The never-fuzzed session is where it was created (no fuzzed id or file reached it)
    and still steps."""
    state = http.get(f"/sessions/{bystander['session_id']}").json()
    assert (state["turn"], state["observation"]) == (0, bystander["observation"]), state
    step = http.post(f"/sessions/{bystander['session_id']}/step", json={"action": action})
    assert step.status_code == 200, step.text


def _serve(env: str) -> Iterator[Target]:
    started_in = set(Path.cwd().iterdir())
    server = start_server_process(env, extra_args=["--log-level", "warning"])
    try:
        wait_healthy(server.url, timeout=180, process=server.process)
        with httpx.Client(base_url=server.url, timeout=TIMEOUT_S) as http:
            # Generous: the first session may wait for its game to be generated.
            session = http.post("/sessions", json={"split": "test", "index": 0}, timeout=300).json()[
                "session_id"
            ]
            bystander = http.post("/sessions", json={"split": "test", "index": 0}, timeout=300).json()
            yield Target(server, http, session, bystander)
            assert server.process.poll() is None, f"the {env} server died"
            # Healthy engines: a 503 engine_failed here would have been bad input let through.
            assert engine_errors(http) == 0, f"fuzzed requests broke {env} engines (see its 503s)"
            bystander_untouched(http, bystander, bystander["info"].get("expert_action") or "look")
    finally:
        server.stop()
    assert set(Path.cwd().iterdir()) == started_in, "an engine wrote where the server was started"


@pytest.fixture(scope="module", params=["choice", "math", "textworld"])
def target(request: pytest.FixtureRequest, agentgym_cache: str) -> Iterator[Target]:
    yield from _serve(request.param)


session_ids = st.one_of(
    texts.filter(lambda t: "/" not in t and "?" not in t and "#" not in t), st.just("LIVE")
)


def _session_path(target: Target, sid: str) -> str:
    return target.session if sid == "LIVE" else _quoted(sid)


def _quoted(text: str) -> str:
    """``text`` percent-encoded for a URL path (lone surrogates as their raw bytes)."""
    return quote(text.encode("utf-8", "surrogatepass"), safe="")


@FUZZ
@given(body=bodies({"action": st.one_of(texts, controls_among_letters, json_values)}))
def test_fuzz_step(target: Target, body: str | bytes) -> None:
    answer = target.check("POST", f"/sessions/{target.session}/step", body)
    if answer.get("error", {}).get("code") in ("session_not_found", "engine_failed", "episode_over"):
        # Keep stepping a live engine: open a fresh episode for the next example.
        target.session = target.http.post("/sessions", json={"split": "test", "index": 0}).json()[
            "session_id"
        ]


@FUZZ
@given(body=bodies({"task_id": texts, "split": texts, "index": numbers, "seed": numbers, "options": options}))
def test_fuzz_create_and_reset(target: Target, body: str | bytes) -> None:
    created = target.check("POST", "/sessions", body)
    if "session_id" in created:  # keep the server below its session cap
        target.http.delete(f"/sessions/{created['session_id']}")
    target.check("POST", f"/sessions/{target.session}/reset", body)


@FUZZ
@given(sid=session_ids, method=st.sampled_from(["GET", "DELETE", "POST", "PUT", "FROB"]))
def test_fuzz_session_routes(target: Target, sid: str, method: str) -> None:
    path = f"/sessions/{_session_path(target, sid)}"
    target.check(method, path if sid != "LIVE" or method != "DELETE" else "/sessions/not-the-live-one")


@FUZZ
@given(params=st.dictionaries(st.sampled_from(["split", "offset", "limit", "x"]), texts, max_size=3))
def test_fuzz_tasks_query(target: Target, params: dict) -> None:
    target.check("GET", "/tasks", params=params)


@FUZZ
@given(
    route=st.sampled_from(["/reset", "/step", "/close", "/create"]),
    body=bodies({"id": numbers, "env_idx": numbers, "data_idx": numbers, "action": texts}),
)
def test_fuzz_compat_routes(target: Target, route: str, body: str | bytes) -> None:
    target.check("POST", route, body)  # no id reaches the bystander: it was not created by /create


@FUZZ
@given(
    route=st.sampled_from(["/observation", "/available_actions"]),
    params=st.dictionaries(st.sampled_from(["id", "env_idx"]), texts | numbers.map(str), max_size=2),
)
def test_fuzz_compat_queries(target: Target, route: str, params: dict) -> None:
    target.check("GET", route, params=params)


@FUZZ
@given(body=deep_options, route=st.sampled_from(["/sessions", "/openenv/reset", "LIVE"]))
def test_fuzz_deep_options(target: Target, body: str, route: str) -> None:
    deep_options_refused(target, body, route)


@HEADER_FUZZ
@given(headers=header_sets)
def test_fuzz_headers(target: Target, headers: dict[str, bytes]) -> None:
    headers_bounded(target, headers)


def deep_options_refused(target: Target, body: str, route: str) -> None:
    """Options nested past the bound are a 422 on every route, before an engine sees them,
    and a reset with them leaves the live session as it was."""
    path = f"/sessions/{target.session}/reset" if route == "LIVE" else route
    answer = target.check("POST", path, body)
    # Past Python's recursion limit the JSON parser itself refuses the body (invalid_payload).
    assert answer.get("error", {}).get("code") in ("validation_error", "invalid_payload"), answer
    assert target.http.get(f"/sessions/{target.session}").status_code == 200


def headers_bounded(target: Target, headers: dict[str, bytes]) -> None:
    """Any header set is served or refused with 431 (past 16 KiB or 100 fields), never 5xx."""
    status, answer = send_raw(target.http, "GET", f"/sessions/{target.session}", headers=headers)
    assert status is not None and target.server.process.poll() is None, "no answer (crashed or hung)"
    size = sum(len(k) + len(v) + 4 for k, v in headers.items())  # "k: v\r\n"
    if len(headers) > 100 or size > 16 * 1024:
        assert status == 431 and answer["error"]["code"] == "headers_too_large", (status, answer)
    else:  # near the bounds httpx's own headers may tip it over
        assert status == 200 or (status == 431 and (len(headers) > 90 or size > 15_000)), (status, answer)


# ----- the gateway ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def gateway(agentgym_cache: str) -> Iterator[Target]:
    """A gateway process over one choice server process; the target's server is the gateway."""
    replica = start_server_process("choice", extra_args=["--log-level", "warning"])
    try:
        wait_healthy(replica.url, timeout=120, process=replica.process)
        front = start_gateway_process({"choice": [replica.url]})
        try:
            wait_healthy(front.url, timeout=120, process=front.process)
            with httpx.Client(base_url=f"{front.url}/envs/choice", timeout=TIMEOUT_S) as http:
                session = http.post("/sessions", json={}).json()["session_id"]
                bystander = http.post("/sessions", json={}).json()
                yield Target(front, http, session, bystander)
                assert replica.process.poll() is None, "the replica died"
                bystander_untouched(http, bystander, "blue")
        finally:
            front.stop()
    finally:
        replica.stop()


@FUZZ
@given(
    route=st.sampled_from(["/step", "/reset", "/close", "/create", "/sessions", "/metadata"]),
    body=bodies(
        {"id": numbers, "env_idx": numbers, "data_idx": numbers, "action": texts, "options": options}
    ),
)
def test_fuzz_gateway_routes(gateway: Target, route: str, body: str | bytes) -> None:
    gateway.check("POST", route, body)
    gateway.check("POST", f"/sessions/{gateway.session}/step", body)


@FUZZ
@given(sid=session_ids, env=texts)
def test_fuzz_gateway_paths(gateway: Target, sid: str, env: str) -> None:
    gateway.check("GET", f"{gateway.server.url}/envs/{_quoted(env)}/sessions/{_quoted(sid)}")
    gateway.check("GET", f"/sessions/{_session_path(gateway, sid)}")
    gateway.check("GET", "/observation", params={"id": sid})


@FUZZ
@given(body=deep_options, route=st.sampled_from(["/sessions", "/openenv/reset", "LIVE"]))
def test_fuzz_gateway_deep_options(gateway: Target, body: str, route: str) -> None:
    deep_options_refused(gateway, body, route)


@HEADER_FUZZ
@given(headers=header_sets)
def test_fuzz_gateway_headers(gateway: Target, headers: dict[str, bytes]) -> None:
    headers_bounded(gateway, headers)
