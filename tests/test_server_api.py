"""Wire API v1 over real HTTP on loopback, against the real textworld environment."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agentgym import make
from agentgym.clients.env_client import AsyncEnvClient, EnvClient
from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.launcher import serve_in_thread


def play_expert(http: httpx.Client, session_id: str, info: dict) -> list[dict]:
    """Follow info["expert_action"] over plain HTTP until the episode ends; return the steps."""
    steps = []
    while "expert_action" in info:
        response = http.post(f"/sessions/{session_id}/step", json={"action": info["expert_action"]})
        assert response.status_code == 200, response.text
        steps.append(response.json())
        info = steps[-1]["info"]
    return steps


def test_expert_episode_over_plain_http(textworld_url: str) -> None:
    with httpx.Client(base_url=textworld_url, timeout=60) as http:
        created = http.post("/sessions", json={"split": "test", "index": 0})
        assert created.status_code == 201, created.text
        body = created.json()
        assert body["info"]["turn"] == 0 and body["info"]["success"] is False
        steps = play_expert(http, body["session_id"], body["info"])
        last = steps[-1]
        assert last["terminated"] is True and last["truncated"] is False
        assert last["info"]["success"] is True
        assert sum(step["reward"] for step in steps) == pytest.approx(1.0)
        assert [step["info"]["turn"] for step in steps] == list(range(1, len(steps) + 1))
        assert http.delete(f"/sessions/{body['session_id']}").status_code == 204


@pytest.fixture
def finished_session(textworld_url: str) -> Iterator[str]:
    with httpx.Client(base_url=textworld_url, timeout=60) as http:
        body = http.post("/sessions", json={"split": "test", "index": 0}).json()
        play_expert(http, body["session_id"], body["info"])
        yield body["session_id"]
        http.delete(f"/sessions/{body['session_id']}")


BAD_REQUESTS = [
    # (name, method, path template, kwargs, status, code)
    ("malformed json", "POST", "/sessions/{sid}/step", {"content": b'{"action": '}, 400, "invalid_payload"),
    ("body not an object", "POST", "/sessions/{sid}/step", {"json": ["look"]}, 400, "invalid_payload"),
    ("missing field", "POST", "/sessions/{sid}/step", {"json": {}}, 422, "validation_error"),
    ("mistyped field", "POST", "/sessions/{sid}/step", {"json": {"action": 7}}, 422, "validation_error"),
    ("unknown field", "POST", "/sessions/{sid}/step", {"json": {"acton": "look"}}, 422, "validation_error"),
    ("empty action", "POST", "/sessions/{sid}/step", {"json": {"action": "  "}}, 400, "invalid_action"),
    (
        "oversized payload",
        "POST",
        "/sessions/{sid}/step",
        {"json": {"action": "x" * 100_000}},
        413,
        "payload_too_large",
    ),
    (
        "unknown session",
        "POST",
        "/sessions/nope/step",
        {"json": {"action": "look"}},
        404,
        "session_not_found",
    ),
    ("unknown session get", "GET", "/sessions/nope", {}, 404, "session_not_found"),
    ("unknown session delete", "DELETE", "/sessions/nope", {}, 404, "session_not_found"),
    ("unknown task", "POST", "/sessions", {"json": {"task_id": "no/such/task"}}, 404, "task_not_found"),
    ("unknown split", "POST", "/sessions", {"json": {"split": "nope"}}, 404, "task_not_found"),
    (
        "index out of range",
        "POST",
        "/sessions",
        {"json": {"split": "test", "index": 10**6}},
        404,
        "task_not_found",
    ),
    (
        "negative index",
        "POST",
        "/sessions",
        {"json": {"split": "test", "index": -1}},
        422,
        "validation_error",
    ),
    ("unknown split in listing", "GET", "/tasks?split=nope", {}, 404, "task_not_found"),
    ("bad paging", "GET", "/tasks?limit=0", {}, 422, "validation_error"),
    ("unknown route", "GET", "/nope", {}, 404, "not_found"),
    (
        "step after episode end",
        "POST",
        "/sessions/{finished}/step",
        {"json": {"action": "look"}},
        409,
        "episode_over",
    ),
]


@pytest.mark.parametrize(
    ("name", "method", "path", "kwargs", "status", "code"),
    BAD_REQUESTS,
    ids=[case[0] for case in BAD_REQUESTS],
)
def test_bad_input_gets_documented_error_and_server_keeps_serving(
    textworld_url: str,
    finished_session: str,
    name: str,
    method: str,
    path: str,
    kwargs: dict,
    status: int,
    code: str,
) -> None:
    with httpx.Client(base_url=textworld_url, timeout=60) as http:
        bystander = http.post("/sessions", json={"split": "train", "index": 1}).json()
        path = path.format(sid=bystander["session_id"], finished=finished_session)
        response = http.request(method, path, **kwargs)
        assert response.status_code == status, response.text
        assert response.json()["error"]["code"] == code
        assert response.json()["error"]["message"]
        # The server still serves, and the bystander session is intact.
        state = http.get(f"/sessions/{bystander['session_id']}").json()
        assert state["turn"] == 0 and not state["done"]
        step = http.post(
            f"/sessions/{bystander['session_id']}/step", json={"action": bystander["info"]["expert_action"]}
        )
        assert step.status_code == 200 and step.json()["info"]["turn"] == 1
        http.delete(f"/sessions/{bystander['session_id']}")


def test_capacity_limit_answers_429_with_retry_after() -> None:
    with serve_in_thread(ServerConfig(env="textworld", max_sessions=2)) as url, EnvClient(url) as client:
        first = client.create(split="test", index=0)
        client.create(split="test", index=1)
        response = httpx.post(f"{url}/sessions", json={"split": "test", "index": 2})
        assert response.status_code == 429
        assert response.json()["error"]["code"] == "at_capacity"
        assert int(response.headers["retry-after"]) >= 1
        client.delete(first.session_id)
        assert client.create(split="test", index=2).info["turn"] == 0


def test_idle_sessions_expire_and_free_their_engines() -> None:
    app = create_app(ServerConfig(env="textworld", ttl=1.0))
    with serve_in_thread(app) as url, EnvClient(url) as client:
        # No count right after the creates: on a loaded machine a create can take longer
        # than the 1 s TTL, so the first session may expire before the third exists.
        ids = [client.create(split="test", index=i).session_id for i in range(3)]
        deadline = time.monotonic() + 15
        while client.health().sessions and time.monotonic() < deadline:
            time.sleep(0.2)
        assert client.health().sessions == 0
        assert app.state.sessions.stats.expired == 3
        for session_id in ids:
            with pytest.raises(Exception, match="no session"):
                client.state(session_id)


def test_engine_failure_closes_only_that_session_with_503() -> None:
    app = create_app(ServerConfig(env="textworld"))
    with serve_in_thread(app) as url, EnvClient(url) as client:
        broken, healthy = client.create(split="test", index=0), client.create(split="test", index=1)
        # Break the real engine underneath the session, as a crashed interpreter would.
        app.state.sessions.get(broken.session_id).env.close()
        response = httpx.post(f"{url}/sessions/{broken.session_id}/step", json={"action": "look"})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "engine_failed"
        assert httpx.get(f"{url}/sessions/{broken.session_id}").status_code == 404
        assert client.step(healthy.session_id, healthy.info["expert_action"]).info["turn"] == 1


def test_calls_on_one_session_are_serialized(textworld_url: str) -> None:
    async def main() -> list[int]:
        async with AsyncEnvClient(textworld_url) as client:
            created = await client.create(split="test", index=0, options={"max_turns": 100})
            results = await asyncio.gather(*(client.step(created.session_id, "look") for _ in range(20)))
            await client.delete(created.session_id)
            return sorted(result.info["turn"] for result in results)

    assert asyncio.run(main()) == list(range(1, 21))


def test_64_concurrent_sessions_have_no_cross_talk(textworld_url: str) -> None:
    """Each session's transcript equals the same task played alone, in-process."""
    task_ids = [
        task["task_id"] for task in httpx.get(f"{textworld_url}/tasks?split=test&limit=8").json()["tasks"]
    ]
    reference = {task_id: expert_transcript_in_process(task_id) for task_id in task_ids}

    async def play(client: AsyncEnvClient, task_id: str) -> list[str]:
        created = await client.create(task_id)
        transcript, info = [created.observation], created.info
        while "expert_action" in info:
            result = await client.step(created.session_id, info["expert_action"])
            transcript.append(result.observation)
            info = result.info
        await client.delete(created.session_id)
        return transcript

    async def main() -> list[list[str]]:
        async with AsyncEnvClient(textworld_url) as client:
            return await asyncio.gather(*(play(client, task_ids[i % len(task_ids)]) for i in range(64)))

    sessions_before = httpx.get(f"{textworld_url}/health").json()["sessions"]
    for i, transcript in enumerate(asyncio.run(main())):
        assert transcript == reference[task_ids[i % len(task_ids)]]
    assert httpx.get(f"{textworld_url}/health").json()["sessions"] == sessions_before


def expert_transcript_in_process(task_id: str) -> list[str]:
    with make("textworld") as env:
        observation, info = env.reset(task_id=task_id)
        transcript = [observation]
        while "expert_action" in info:
            observation, *_, info = env.step(info["expert_action"])
            transcript.append(observation)
        return transcript


def test_bearer_token_required_except_health() -> None:
    with serve_in_thread(ServerConfig(env="textworld", token="s3cret")) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        denied = httpx.get(f"{url}/metadata")
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "unauthorized"
        assert httpx.get(f"{url}/metadata", headers={"Authorization": "Bearer wrong"}).status_code == 401
        with EnvClient(url, token="s3cret") as client:
            assert client.metadata().name == "textworld"


def test_metadata_tasks_and_openapi(textworld_url: str) -> None:
    with EnvClient(textworld_url) as client:
        meta = client.metadata()
        assert meta.name == "textworld" and meta.splits["train"] > 0 and meta.splits["test"] > 0
        page = client.tasks(split="train", offset=2, limit=3)
        assert page.total == meta.splits["train"] and len(page.tasks) == 3
        assert all(task.split == "train" for task in page.tasks)
        everything = client.tasks(limit=10_000)
        assert everything.total == sum(meta.splits.values())
        assert len({task.task_id for task in everything.tasks}) == everything.total
    spec = httpx.get(f"{textworld_url}/openapi.json").json()
    assert {"/sessions", "/sessions/{session_id}/step", "/create", "/step"} <= set(spec["paths"])


def test_metrics_are_prometheus_text(textworld_url: str) -> None:
    with EnvClient(textworld_url) as client:
        created = client.create(split="test", index=0)
        client.delete(created.session_id)
    response = httpx.get(f"{textworld_url}/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    families = {family.name: family for family in text_string_to_metric_families(response.text)}
    assert "agentgym_http_requests" in families and "agentgym_sessions_active" in families
    created_total = next(iter(families["agentgym_sessions_created"].samples)).value
    assert created_total >= 1


LANE = {"content-type": "application/json"}
ROUTE = {"content-type": "application/merge-patch+json"}  # JSON to FastAPI, not to the step lane


def test_the_step_lane_answers_exactly_as_the_route(textworld_url: str) -> None:
    """Plain ``{"action": ...}`` steps take servers/step_lane.py; any other JSON body the
    FastAPI route. Two sessions of one game stepped each way must answer byte for byte
    alike, errors included, and be counted under the same route label."""

    def step(http: httpx.Client, sid: str, action: object, headers: dict) -> tuple[int, bytes]:
        response = http.post(f"/sessions/{sid}/step", content=json.dumps({"action": action}), headers=headers)
        return response.status_code, response.content

    with httpx.Client(base_url=textworld_url, timeout=60) as http:
        lane, route = (http.post("/sessions", json={"split": "test", "index": 1}).json() for _ in range(2))
        actions = ["look", "inventory", "", "look\u0000", lane["info"]["expert_action"]]
        for action in actions:
            answers = [step(http, s["session_id"], action, h) for s, h in ((lane, LANE), (route, ROUTE))]
            assert answers[0] == answers[1], action
        statuses = [step(http, "no-such-session", "look", h)[0] for h in (LANE, ROUTE)]
        assert statuses == [404, 404]
        for created in (lane, route):
            http.delete(f"/sessions/{created['session_id']}")
        metrics = http.get("/metrics").text
    step_200 = 'route="/sessions/{session_id}/step",status="200"'
    assert any(
        step_200 in line and line.startswith("agentgym_http_requests_total") for line in metrics.splitlines()
    )


def test_agentgym_compatible_routes(textworld_url: str) -> None:
    with httpx.Client(base_url=textworld_url, timeout=60) as http:
        env_id = http.post("/create").json()["id"]
        reset = http.post("/reset", json={"id": env_id, "data_idx": 0}).json()
        assert reset["observation"]
        expert = reset["info"]["expert_action"]
        assert expert in http.get("/available_actions", params={"id": env_id}).json()
        step = http.post("/step", json={"env_idx": env_id, "action": expert}).json()
        assert {"observation", "reward", "done"} <= set(step)
        assert http.get("/observation", params={"env_idx": env_id}).json() == step["observation"]
        assert http.post("/close", json={"id": env_id}).json()["closed"] is True
        missing = http.post("/step", json={"id": env_id, "action": "look"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
