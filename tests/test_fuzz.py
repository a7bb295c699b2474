"""Issue 19 item 5: property-based fuzzing of every route of the env servers (wire API v1
and the AgentGym-compatible routes) and of the gateway.

Random Unicode (control characters and lone surrogates included), huge and non-finite
numbers, wrong types and unparseable bodies go to each route. Properties: no 5xx but a
documented engine failure (503 ``engine_failed``), the server process stays alive, and a
bystander session on the same server still steps. Servers run as child processes, so a
crash is a failed assertion rather than a dead pytest. Examples per route are bounded
(``EXAMPLES``) to keep the file near a minute on two cores.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote

import httpx
import pytest
from conftest import engine_errors, send_raw
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentgym.servers.launcher import ServerProcess, start_gateway_process, start_server_process, wait_healthy

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

# ----- what is thrown ------------------------------------------------------------------

any_char = st.characters(exclude_categories=())  # control characters and lone surrogates too
controls_among_letters = st.text(st.characters(max_codepoint=0x9F), min_size=2, max_size=12)
"""ASCII dense in C0/C1 controls: what made the Z-machine segfault ("\u00c5\u0015", "look\u000e")."""
texts = st.one_of(
    st.text(any_char, max_size=40),
    st.text(st.characters(max_codepoint=0x7F), max_size=40),
    controls_among_letters,
    st.sampled_from(["look", "go north", "blue", "\\hello", "The answer is 4", "train", "test", "boil/²"]),
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


def _serve(env: str) -> Iterator[Target]:
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
            action = bystander["info"].get("expert_action") or "look"
            step = http.post(f"/sessions/{bystander['session_id']}/step", json={"action": action})
            assert step.status_code == 200, step.text
    finally:
        server.stop()


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
    target.check("POST", route, _spare_bystander(body))


@FUZZ
@given(
    route=st.sampled_from(["/observation", "/available_actions"]),
    params=st.dictionaries(st.sampled_from(["id", "env_idx"]), texts, max_size=2),
)
def test_fuzz_compat_queries(target: Target, route: str, params: dict) -> None:
    target.check("GET", route, params={k: "0" if _names_bystander(v) else v for k, v in params.items()})


BYSTANDER_COMPAT_ID = 1
"""The fixture opens the fuzzed session, then the bystander: compat ids 0 and 1."""


def _names_bystander(value: object) -> bool:
    """Whether a server could read ``value`` as the bystander's compat id (1, 1.0, true, " 1 ")."""
    return value == BYSTANDER_COMPAT_ID or (
        isinstance(value, str) and value.strip() == str(BYSTANDER_COMPAT_ID)
    )


def _spare_bystander(body: str | bytes) -> str | bytes:
    """The body with any id naming the bystander pointed at the fuzzed session instead:
    a fuzzer that steps or closes the bystander by its compat id would test nothing."""
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(payload, dict):
        return body
    return json.dumps(
        {k: 0 if k in ("id", "env_idx") and _names_bystander(v) else v for k, v in payload.items()}
    )


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
                assert (
                    http.post(
                        f"/sessions/{bystander['session_id']}/step", json={"action": "blue"}
                    ).status_code
                    == 200
                )
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
