"""Sessions that cannot touch each other (issue 40, item 1; item 4's hung JVM), through HTTP.

For every engine, two sessions on one task side by side: one plays while the other waits,
and the waiting one must see its world as it left it, then replay the same actions and see
what the first saw (so nothing of the first carried over); after both close, the
directory the servers were started from is still empty. Every server of this module is
started from that directory (the engine worker processes keep it as their working
directory), and the process-wide engines (threads, chromium) run there while it lasts.

TextWorld's interpreter meta-verbs (``save`` wrote ``game.qzl`` into the working directory
and any later session could ``restore`` it; ``script`` wrote files named after the command)
are refused with a 400 naming them. A ScienceWorld JVM hung by SIGSTOP costs only its own
session: the engine worker aborts the call by killing that JVM instead of being killed
with every session on it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentgym.servers.app import ServerConfig, create_app
from agentgym.servers.launcher import serve_in_thread

TEXTWORLD = {"challenges": ["tw-cooking"], "n_train": 1, "n_test": 1, "n_validation": 1, "prefetch": False}
SCIWORLD = {"heap_mb": 256, "max_jvms": 4, "spare_jvms": 1, "max_idle_jvms": 2}
SCIWORLD_STEP_DEADLINE_S = 5.0
"""Short enough to wait for, far above a ScienceWorld step (milliseconds)."""
WEBSHOP = {"n_products": 1500, "n_train": 40, "n_test": 60}
META_VERB_ACTIONS = [
    "save",
    "restore",
    "restart",
    "undo",
    "quit",
    "script",
    "unscript",
    "transcript",
    "script on",
    "  SAVE",
    "save then look",
    "look. save",
    "look.restore",
    "transcripts",
]


@pytest.fixture(scope="module")
def server_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The (empty) directory every server of this module is started from."""
    folder, old = tmp_path_factory.mktemp("server-cwd"), os.getcwd()
    os.chdir(folder)
    yield folder
    os.chdir(old)


@pytest.fixture(scope="module")
def textworld(server_dir: Path, agentgym_cache: str) -> Iterator[str]:
    """A textworld server with one engine worker: both sessions' games run in one process."""
    with serve_in_thread(
        ServerConfig(env="textworld", env_config=TEXTWORLD, engine_workers=1, warm=0)
    ) as url:
        yield url


@pytest.fixture(scope="module")
def sciworld(server_dir: Path) -> Iterator[Any]:
    """A sciworld server with one engine worker (both sessions' JVMs are driven from one
    process) and a short step deadline; yields its app (for JVM pids) and URL."""
    pytest.importorskip("scienceworld")
    from agentgym.envs.sciworld.jvm import shutdown_pools

    config = ServerConfig(
        env="sciworld", env_config=SCIWORLD, engine_workers=1, warm=2, step_deadline=SCIWORLD_STEP_DEADLINE_S
    )
    app = create_app(config)
    with serve_in_thread(app) as url:
        yield app, url
    shutdown_pools()  # the catalog instance's pool in this process


def create(http: httpx.Client, task: dict[str, Any]) -> dict[str, Any]:
    response = http.post("/sessions", json=task)
    assert response.status_code == 201, response.text
    return response.json()


def step(http: httpx.Client, session: dict[str, Any], action: str) -> httpx.Response:
    return http.post(f"/sessions/{session['session_id']}/step", json={"action": action})


def files(server_dir: Path) -> set[str]:
    """What the servers' directory holds (compared before and after each test, so that one
    test's leftovers do not fail the next)."""
    return set(os.listdir(server_dir))


def seen(response: httpx.Response) -> tuple[str, float, int]:
    assert response.status_code == 200, response.text
    body = response.json()
    return body["observation"], body["reward"], body["info"]["turn"]


def side_by_side(
    url: str, server_dir: Path, task: dict[str, Any], moves: int = 0, actions: Sequence[str | None] = ()
) -> None:
    """Session A plays ``actions`` (``None``: its expert's action), else up to ``moves`` of
    its expert's, while B waits; B must be as it was, then see what A saw when it plays the
    same actions; no file is left in the servers' directory after both closed."""
    before = files(server_dir)
    with httpx.Client(base_url=url, timeout=300) as http:
        a, b = create(http, task), create(http, task)
        assert a["observation"] == b["observation"]
        played, a_seen, info = [], [], a["info"]
        for action in list(actions) or [None] * moves:
            action = action or info.get("expert_action")
            if action is None:
                break
            response = step(http, a, action)
            played.append(action)
            a_seen.append(seen(response))
            info = response.json()["info"]
            if response.json()["terminated"]:
                break
        assert played, "session A played nothing"
        state = http.get(f"/sessions/{b['session_id']}").json()
        assert (state["turn"], state["observation"]) == (0, b["observation"])  # untouched by A
        assert [seen(step(http, b, action)) for action in played] == a_seen
        for session in (a, b):
            assert http.delete(f"/sessions/{session['session_id']}").status_code == 204
            assert http.get(f"/sessions/{session['session_id']}").status_code == 404
    assert files(server_dir) == before


# ----- TextWorld ---------------------------------------------------------------------------


def test_textworld_sessions_are_isolated(textworld: str, server_dir: Path) -> None:
    side_by_side(textworld, server_dir, {"split": "train", "index": 0}, moves=10)


def test_textworld_save_cannot_carry_a_game_into_another_session(textworld: str, server_dir: Path) -> None:
    """The reward hack: play two of the expert's actions, save; a fresh session restores
    and wins with the last action. Both meta-verbs are a 400 now, and no file is written."""
    before = files(server_dir)
    with httpx.Client(base_url=textworld, timeout=300) as http:
        first = create(http, {"split": "train", "index": 0})
        info = first["info"]
        for _ in range(2):
            info = step(http, first, info["expert_action"]).json()["info"]
        save = step(http, first, "save")
        assert save.status_code == 400, save.text
        assert save.json()["error"]["code"] == "invalid_action" and "save" in save.json()["error"]["message"]
        assert http.get(f"/sessions/{first['session_id']}").json()["turn"] == 2  # no turn spent
        fresh = create(http, {"split": "train", "index": 0})
        restore = step(http, fresh, "restore")
        assert restore.status_code == 400 and "restore" in restore.json()["error"]["message"]
        assert http.get(f"/sessions/{fresh['session_id']}").json()["info"]["score"] == 0
        for session in (first, fresh):
            http.delete(f"/sessions/{session['session_id']}")
    assert files(server_dir) == before


@pytest.mark.parametrize("action", META_VERB_ACTIONS)
def test_textworld_refuses_interpreter_meta_verbs_and_writes_no_file(
    textworld: str, server_dir: Path, action: str
) -> None:
    before = files(server_dir)
    with httpx.Client(base_url=textworld, timeout=300) as http:
        session = create(http, {"split": "train", "index": 0})
        response = step(http, session, action)
        assert response.status_code == 400, (action, response.text, files(server_dir))
        assert response.json()["error"]["code"] == "invalid_action"
        assert "meta-verb" in response.json()["error"]["message"]
        assert seen(step(http, session, "look"))[2] == 1  # the session plays on
        http.delete(f"/sessions/{session['session_id']}")
    assert files(server_dir) == before


# ----- ScienceWorld ------------------------------------------------------------------------


def test_sciworld_sessions_are_isolated(sciworld: Any, server_dir: Path) -> None:
    _, url = sciworld
    side_by_side(url, server_dir, {"task_id": "find-plant/1"}, moves=6)


def test_a_hung_jvm_costs_only_its_own_session(sciworld: Any, server_dir: Path) -> None:
    """SIGSTOP one session's JVM: its step fails at the deadline (503), the engine worker both
    sessions share survives, and the other session steps on (before: the worker was
    killed at the deadline and the other session with it). The JVM's own call timeout is
    left at its default, above this server's deadline, so the deadline is what fires."""
    from agentgym.envs.sciworld.jvm import JvmSettings

    before = files(server_dir)
    app, url = sciworld
    host = app.state.sessions.host
    with httpx.Client(base_url=url, timeout=300) as http:
        victim, survivor = (create(http, {"task_id": f"find-plant/{v}"}) for v in (2, 3))
        engines = [app.state.sessions.get(s["session_id"]).env for s in (victim, survivor)]
        assert engines[0].worker is engines[1].worker
        worker, jvm = engines[0].worker.pid, engines[0].jvm_pid
        os.kill(jvm, signal.SIGSTOP)
        try:
            failed = step(http, victim, "look around")
        finally:
            os.kill(jvm, signal.SIGKILL)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "engine_failed", failed.text
        action = survivor["info"]["expert_action"]
        assert seen(step(http, survivor, action))[2] == 1
        assert host.pids() == [worker] and host.replaced == 0  # the worker was not killed
        assert http.get(f"/sessions/{victim['session_id']}").status_code == 404
        http.delete(f"/sessions/{survivor['session_id']}")
    assert files(server_dir) == before
    # By default the JVM's own call timeout fires before the deadline (no abort needed).
    assert JvmSettings.call_timeout_s < ServerConfig.step_deadline


# ----- WebShop, search, math, choice (engines in the server's threads) ---------------------


def test_webshop_text_sessions_are_isolated(server_dir: Path, agentgym_cache: str) -> None:
    pytest.importorskip("tantivy")
    with serve_in_thread(ServerConfig(env="webshop", env_config=WEBSHOP)) as url:
        side_by_side(url, server_dir, {"task_id": "test/3"}, moves=8)


def test_webshop_browser_sessions_are_isolated(server_dir: Path, agentgym_cache: str) -> None:
    pytest.importorskip("tantivy")
    pytest.importorskip("playwright")
    from agentgym.envs.webshop.browser import CHROMIUM

    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian chromium at {CHROMIUM}")
    with serve_in_thread(ServerConfig(env="webshop", env_config={**WEBSHOP, "mode": "browser"})) as url:
        side_by_side(url, server_dir, {"task_id": "test/3"}, moves=8)


def test_search_sessions_are_isolated(server_dir: Path, agentgym_cache: str) -> None:
    with serve_in_thread(ServerConfig(env="search")) as url:
        side_by_side(url, server_dir, {"split": "test", "index": 0}, moves=4)


def test_math_sessions_are_isolated(server_dir: Path) -> None:
    with serve_in_thread(ServerConfig(env="math", env_config={"n_train": 4, "n_test": 4})) as url:
        task = {"split": "test", "index": 0, "options": {"max_turns": 2}}
        side_by_side(url, server_dir, task, actions=["no idea", None])  # a wrong answer, then the expert's


def test_choice_sessions_are_isolated(choice_url: str, server_dir: Path) -> None:
    side_by_side(choice_url, server_dir, {"split": "test", "index": 0}, moves=1)
