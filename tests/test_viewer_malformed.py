"""Issue 40, the viewer: an episode it cannot show is skipped and counted, never a 500, and
a trajectory file rewritten under it is read again. Over HTTP, the viewer on loopback."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx

from agentgym.servers.launcher import serve_in_thread
from agentgym.viewer import create_app

HTTP = httpx.Client(timeout=30.0, limits=httpx.Limits(max_keepalive_connections=0))
"""A connection per request: a server error closes its connection, and must fail the
assertion on its status, not the next request."""


def record(task_id: str, **fields: object) -> str:
    base = {
        "env": "choice",
        "task_id": task_id,
        "messages": [{"role": "user", "content": "pick"}, {"role": "assistant", "content": "Action: blue"}],
        "actions": ["blue"],
        "rewards": [1.0],
        "turns": 1,
    }
    return json.dumps(base | fields) + "\n"


MALFORMED = [
    record("messages-a-string", messages="hello"),
    record("messages-null", messages=None),
    record("messages-of-numbers", messages=[1, 2]),
    record("message-without-content", messages=[{"role": "assistant"}]),
    record("mask-shorter-than-tokens", token_ids=[1, 2, 3], loss_mask=[0, 1], logprobs=[0.0, -0.1, -0.2]),
    record("logprobs-longer", token_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -0.1, -0.2]),
    record("mask-without-tokens", loss_mask=[1]),
    record("token-ids-of-text", token_ids=["a"], loss_mask=[1]),
    record("actions-an-object", actions={"0": "blue"}),
]


def every_episode_opens(url: str) -> list[dict]:
    """Every listed episode, opened: each must answer 200."""
    listed = HTTP.get(f"{url}/api/episodes", params={"limit": 500}).json()["episodes"]
    opened = [HTTP.get(f"{url}/api/episodes/{episode['id']}") for episode in listed]
    assert [answer.status_code for answer in opened] == [200] * len(listed), [a.text for a in opened]
    return [answer.json() for answer in opened]


def test_malformed_episodes_are_skipped_and_counted(tmp_path: Path) -> None:
    """`messages` not a list, or token_ids/loss_mask of different lengths, were listed and
    then answered 500 when opened."""
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text(
        record("ok-1") + "".join(MALFORMED) + record("ok-2", token_ids=[5], loss_mask=[1])
    )
    with serve_in_thread(create_app(trajectories)) as url:
        info = HTTP.get(f"{url}/api/info").json()
        assert (info["episodes"], info["skipped_lines"]) == (2, len(MALFORMED)), info
        assert [episode["task_id"] for episode in every_episode_opens(url)] == ["ok-1", "ok-2"]


def test_a_file_rewritten_under_the_viewer_is_read_again(tmp_path: Path) -> None:
    """Its episodes were read at their old byte offsets: a 500 for any episode after a
    rewrite, and a file that shrank was never read again."""
    trajectories = tmp_path / "trajectories.jsonl"
    trajectories.write_text("".join(record(f"old-{i}") for i in range(3)))
    with serve_in_thread(create_app(trajectories)) as url:
        old = HTTP.get(f"{url}/api/episodes").json()["episodes"]
        assert [episode["task_id"] for episode in old] == ["old-0", "old-1", "old-2"]
        # Rewritten shorter in place (a re-run writing the same path), then opened at once:
        trajectories.write_text(record("new-0", turns=2) + record("bad", messages="x"))
        answers = [HTTP.get(f"{url}/api/episodes/{episode['id']}") for episode in old]
        assert [answer.status_code for answer in answers] == [404] * 3, [a.text for a in answers]
        assert {answer.json()["error"]["code"] for answer in answers} == {"not_found"}
        info = HTTP.get(f"{url}/api/info").json()
        assert (info["episodes"], info["skipped_lines"]) == (1, 1), info
        assert [episode["task_id"] for episode in every_episode_opens(url)] == ["new-0"]
        # Replaced by another file of the same size (written aside, renamed over it):
        replacement = tmp_path / "next.jsonl.tmp"
        replacement.write_text(record("new-1", turns=2) + record("bad", messages="y"))
        replacement.replace(trajectories)
        time.sleep(1.1)  # the index re-reads files at most once a second
        assert [episode["task_id"] for episode in every_episode_opens(url)] == ["new-1"]
        # Then appended to, as a live run does: read from where it was.
        with trajectories.open("a") as appended:
            appended.write(record("new-2"))
        time.sleep(1.1)
        assert [episode["task_id"] for episode in every_episode_opens(url)] == ["new-1", "new-2"]
