"""AgentGym's own clients, replayed against our servers (issue 20, item 1).

For each env AgentGym has a server for (webshop, searchqa, sciworld), the requests its
client in ``agentenv/envs/<env>.py`` sends, built as that code builds them (``requests``
with ``json=``: ``json.dumps`` with its default separators, keys in the client's order;
``/create`` with no body where it sends none; GETs with the id in the query string), on a
real server on loopback, playing a whole expert episode on the task the client asked for.
The expert's actions come from a local env of the same configuration on the same task,
stepped in lockstep: every remote observation must equal the local one, so the server
really plays the task asked for (and not task 0). Their code is not vendored; this module
is written from reading it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentgym.contract.core import TextEnv
from agentgym.registry import make
from agentgym.servers.app import ServerConfig
from agentgym.servers.gateway import GatewayConfig, create_gateway_app
from agentgym.servers.launcher import serve_in_thread

WEBSHOP = {"n_products": 1500, "n_train": 40, "n_test": 60}  # envs/webshop/tests/test_webshop.py's: one index
SEARCH: dict[str, Any] = {}  # the default configuration, as in envs/search/tests/test_search_env.py
SCIWORLD = {"heap_mb": 256, "max_jvms": 4, "spare_jvms": 0, "max_idle_jvms": 1}


def requests_post(http: httpx.Client, path: str, data: dict[str, Any] | None = None) -> httpx.Response:
    """What ``requests.post(url, json=data)`` puts on the wire (no body without ``json=``)."""
    if data is None:
        return http.post(path)
    body = json.dumps(data, allow_nan=False).encode()  # requests: complexjson.dumps(json, allow_nan=False)
    return http.post(path, content=body, headers={"Content-Type": "application/json"})


def ok(response: httpx.Response) -> Any:
    """AgentGym's clients ``assert res.status_code == 200`` and read ``res.json()``."""
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=120) as client:
        yield client


def local(env: str, config: dict[str, Any], split: str, index: int) -> tuple[TextEnv, str]:
    """A local env of the server's configuration on task ``index`` of ``split``, and its
    first observation."""
    instance = make(env, **config)
    task_id = instance.task_at(split, index).task_id
    observation, info = instance.reset(task_id=task_id)
    assert info["task_id"] == task_id
    return instance, observation


def first_observation(env: str, config: dict[str, Any], split: str, index: int) -> str:
    instance, observation = local(env, config, split, index)
    instance.close()
    return observation


# ----- WebShop: agentenv/envs/webshop.py against agentenv-webshop's server -------------------


class WebshopCalls:
    """The requests of AgentGym's ``WebshopEnvClient``: ``/create`` without a body answers a
    bare integer; every POST body is ``data | {"env_idx": id}``; GETs carry ``?env_idx=``."""

    def __init__(self, http: httpx.Client, base: str) -> None:
        self.http, self.base = http, base
        self.env_id = ok(requests_post(http, f"{base}/create"))

    def post(self, path: str, data: dict[str, Any]) -> Any:
        data["env_idx"] = self.env_id
        return ok(requests_post(self.http, f"{self.base}/{path}", data))

    def get(self, path: str) -> Any:
        return ok(self.http.get(f"{self.base}/{path}?env_idx={self.env_id}"))

    def reset(self, idx: int) -> list[Any]:
        response = self.post("reset", {"session_id": idx})
        response[0] = self.get("observation")  # the client does exactly this: a list, not a dict
        return response

    def step(self, action: str) -> dict[str, Any]:
        response = self.post("step", {"action": action})
        return {"state": response["state"], "reward": response["reward"], "done": response["done"]}


@pytest.fixture(scope="module")
def webshop_url() -> Iterator[str]:
    pytest.importorskip("tantivy")
    with serve_in_thread(ServerConfig(env="webshop", env_config=WEBSHOP)) as url:
        yield url


def test_webshop_client_plays_the_goal_it_asked_for(http: httpx.Client, webshop_url: str) -> None:
    client = WebshopCalls(http, webshop_url)
    assert isinstance(client.env_id, int)
    reset = http.post(f"{webshop_url}/reset", json={"env_idx": client.env_id, "session_id": 7}).json()
    assert len(reset) == 2 and reset[1] is None  # AgentGym's response_model: Tuple[str, None]
    assert client.reset(7)[1] is None
    env, observation = local("webshop", WEBSHOP, "test", 7)  # session_id numbers WebShop's goals: test first
    assert client.get("observation") == observation == reset[0]
    assert observation != first_observation("webshop", WEBSHOP, "test", 0)
    assert client.get("available_actions") == {"has_search_bar": True, "clickables": []}
    rewards = []
    while not env.done:
        action = env.expert_action()
        observation, *_ = env.step(action)
        step = client.step(action)
        assert step["state"] == observation and step["done"] is env.done
        rewards.append(step["reward"])
        if not env.done:
            clickables = client.get("available_actions")
            assert [f"click[{c}]" for c in clickables["clickables"]] == [
                a for a in env.available_actions() if a.startswith("click[")
            ]
    assert sum(rewards) == 1.0 and rewards[-1] == 1.0
    assert ok(requests_post(http, f"{webshop_url}/close", {"env_idx": client.env_id}))["closed"]


def test_webshop_session_ids_past_the_test_goals_are_train_goals(
    http: httpx.Client, webshop_url: str
) -> None:
    client = WebshopCalls(http, webshop_url)
    assert client.reset(WEBSHOP["n_test"] + 3)[0] == first_observation("webshop", WEBSHOP, "train", 3)
    unknown = requests_post(http, f"{webshop_url}/reset", {"session_id": 10**6, "env_idx": client.env_id})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "task_not_found"
    # Our own form (data_idx, /metadata order: train first) still answers our reset object.
    ours = ok(requests_post(http, f"{webshop_url}/reset", {"env_idx": client.env_id, "data_idx": 0}))
    assert ours["task_id"] == "train/0" and ours["observation"] == client.get("observation")


# ----- SearchQA: agentenv/envs/searchqa.py against agentenv-searchqa's server -----------------


class SearchQACalls:
    """The requests of AgentGym's ``SearchQAEnvClient``: ``/create {"id": 0}`` answers a bare
    integer; POST bodies are ``data | {"env_idx": id}``; its reset sends the item as ``id``."""

    def __init__(self, http: httpx.Client, base: str) -> None:
        self.http, self.base = http, base
        self.env_id = ok(requests_post(http, f"{base}/create", {"id": 0}))

    def post(self, path: str, data: dict[str, Any]) -> Any:
        data["env_idx"] = self.env_id
        return ok(requests_post(self.http, f"{self.base}/{path}", data))

    def observe(self) -> str:
        return ok(self.http.get(f"{self.base}/observation?env_idx={self.env_id}"))

    def reset(self, id: int) -> Any:
        return self.post("reset", {"id": id})

    def step(self, action: str) -> dict[str, Any]:
        response = self.post("step", {"action": action})
        return {"state": response["observation"], "reward": response["reward"], "done": response["done"]}

    def close(self) -> Any:
        return self.post("close", {})


def as_search_r1(action: str) -> str:
    """Our expert's ``search[q]`` / ``answer[a]`` as the tags SearchQA's agents write."""
    verb, argument = re.fullmatch(r"(search|answer)\[(.*)\]", action, re.DOTALL).groups()
    return f"<think>I will {verb}.</think>\n<{verb}> {argument} </{verb}>"


@pytest.fixture(scope="module")
def search_url() -> Iterator[str]:
    with serve_in_thread(ServerConfig(env="search", env_config=SEARCH)) as url:
        yield url


def test_searchqa_client_plays_the_question_it_asked_for(http: httpx.Client, search_url: str) -> None:
    client = SearchQACalls(http, search_url)
    assert isinstance(client.env_id, int)
    # /create {"id": 0} loaded item 0
    assert client.observe() == first_observation("search", SEARCH, "test", 0)
    env, observation = local("search", SEARCH, "test", 5)  # ids number AgentGym's items: test first
    assert client.reset(5) == observation == client.observe()  # /reset answers the bare observation
    assert observation != first_observation("search", SEARCH, "test", 0)
    rewards = []
    while not env.done:
        action = env.expert_action()
        observation, *_ = env.step(action)
        step = client.step(as_search_r1(action))
        assert step["state"] == observation and step["done"] is env.done
        rewards.append(step["reward"])
    assert rewards[-1] == 1.0 and env.last_info["success"]
    assert client.close() is True


def test_searchqa_item_numbering_and_our_own_form(http: httpx.Client, search_url: str) -> None:
    tests = ok(http.get(f"{search_url}/metadata"))["splits"]["test"]
    client = SearchQACalls(http, search_url)
    assert client.reset(tests + 2) == first_observation("search", SEARCH, "train", 2)
    created = requests_post(http, f"{search_url}/create", {"id": 10**7})
    assert created.status_code == 404 and ok(http.get(f"{search_url}/health"))["sessions"] == 1
    # Our own form: the session in id, the task in data_idx (/metadata order), our reset object.
    ours = ok(requests_post(http, f"{search_url}/reset", {"id": client.env_id, "data_idx": 1}))
    assert ours["task_id"] == ok(http.get(f"{search_url}/tasks", params={"limit": 2}))["tasks"][1]["task_id"]
    assert client.close() is True


def test_searchqa_requests_through_the_gateway(http: httpx.Client, search_url: str) -> None:
    """Two replicas: the gateway must map ``env_idx``, never the item index in ``id``."""
    with (
        serve_in_thread(ServerConfig(env="search", env_config=SEARCH)) as second,
        serve_in_thread(create_gateway_app(GatewayConfig({"search": [search_url, second]}))) as gateway,
    ):
        clients = [SearchQACalls(http, f"{gateway}/envs/search") for _ in range(2)]
        assert len({c.env_id for c in clients}) == 2  # the replicas' own ids, passed through
        for client in clients:
            assert client.reset(3) == first_observation("search", SEARCH, "test", 3)
            assert client.close() is True


# ----- SciWorld: agentenv/envs/sciworld.py against agentenv-sciworld's server -----------------


class SciworldCalls:
    """The requests of AgentGym's ``SciworldEnvClient``: ``/create`` without a body answers
    ``{"id": N}``; POST bodies are ``data | {"id": N}``."""

    def __init__(self, http: httpx.Client, base: str) -> None:
        self.http, self.base = http, base
        self.env_id = ok(requests_post(http, f"{base}/create"))["id"]

    def post(self, path: str, data: dict[str, Any]) -> Any:
        data["id"] = self.env_id
        return ok(requests_post(self.http, f"{self.base}/{path}", data))


def test_sciworld_client_plays_the_task_it_asked_for(http: httpx.Client) -> None:
    pytest.importorskip("scienceworld")
    # AgentGym's games list: ScienceWorld's task types but 5-1, 5-2, 9-*, 10-*, in order, each
    # with all its variations; find-non-living-thing (4-2) starts at 3236.
    data_idx, task_type, variation = 3236 + 225, "find-non-living-thing", 225
    with serve_in_thread(ServerConfig(env="sciworld", env_config=SCIWORLD)) as url:
        client = SciworldCalls(http, url)
        reset = client.post("reset", {"data_idx": data_idx})
        assert (reset["task_name"], reset["var_num"]) == (task_type, variation)
        assert reset["task_id"] == f"{task_type}/{variation}" and reset["score"] == 0
        assert set(reset) >= {"task_description", "observation", "reward", "deleted", "done"}
        info = reset["info"]
        while "expert_action" in info:
            step = client.post("step", {"action": info["expert_action"]})
            assert set(step) >= {"observation", "reward", "score", "done"}
            info = step["info"]
        assert step["done"] and step["score"] == 100 and info["success"]
        assert ok(http.get(f"{url}/observation?id={client.env_id}")) == step["observation"]
        assert client.post("close", {}) is True
