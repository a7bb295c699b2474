"""Viewer scale: a 10,000-episode trajectory file, paged by ``agentgym view``'s API.

    python bench/viewer.py [--episodes 10000] [--turns 6] [--json out.json]

Writes token-level episodes shaped like the trainer's rollouts (react replies, one trained
token run per reply, behaviour log-probs, per-turn rewards, mixed success) with the
project's ``TrajectoryWriter``, then measures through the real app (in-process HTTP):
index build (first scan of the file), first page, a filtered page (failed episodes of one
step) deep in the list, and opening one episode. Also used by ``tests/test_viewer.py`` to
make its data (:func:`synthetic_episode`, :class:`WordDecoder`).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentgym.records.trajectory import Trajectory, TrajectoryWriter

ACTIONS = ("go north", "go east", "take key", "open door", "look", "inventory")
SYSTEM = "You are an agent in a text game. Reply as:\nThought: <reasoning>\nAction: <one command>"


class WordDecoder:
    """A toy tokenizer: one token per whitespace-separated word (id = position in a vocab
    built on the fly). Stands in for a model tokenizer, which the bench and tests never load."""

    name = "words"

    def __init__(self) -> None:
        self.vocab: list[str] = []
        self.ids: dict[str, int] = {}

    def encode(self, text: str) -> list[int]:
        return [self._id(w) for w in text.replace("\n", " \n ").split(" ") if w]

    def _id(self, word: str) -> int:
        if word not in self.ids:  # a new word only: setdefault would append every word it sees
            self.ids[word] = len(self.vocab)
            self.vocab.append(word)
        return self.ids[word]

    def pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.vocab[i] + " " for i in ids]


def synthetic_episode(i: int, tokens: WordDecoder, turns: int = 6, env: str = "textworld") -> Trajectory:
    """Episode ``i``: a deterministic mix of outcomes (about 40% successes), ``1..turns`` turns;
    episodes ``i`` and ``i + 60`` play the same task (as consecutive training steps do)."""
    rng = random.Random(i)
    n = rng.randint(1, turns)
    success = rng.random() < 0.4
    messages = [{"role": "system", "content": SYSTEM, "loss": False}]
    token_ids, mask, logprobs, rewards, actions = [], [], [], [], []
    observation = f"You are in room {rng.randint(1, 50)}. A door leads north."
    for turn in range(n):
        messages.append({"role": "user", "content": observation, "loss": False})
        prompt = tokens.encode(
            ("<sys> " + SYSTEM + " " if turn == 0 else "") + "<user> " + observation + " <asst>"
        )
        action = rng.choice(ACTIONS)
        reply = f"Thought: step {turn + 1}, I should {action}.\nAction: {action}"
        messages.append({"role": "assistant", "content": reply, "loss": True})
        sampled = tokens.encode(reply)
        token_ids += prompt + sampled
        mask += [0] * len(prompt) + [1] * len(sampled)
        logprobs += [0.0] * len(prompt) + [round(-rng.random() * 2, 4) for _ in sampled]
        last = turn == n - 1
        rewards.append(1.0 if (last and success) else round(rng.choice((0.0, 0.0, 0.1)), 2))
        actions.append(action)
        observation = f"You {action}. Nothing else happens." if not last else "The game is over."
    messages.append({"role": "user", "content": observation, "loss": False})
    return Trajectory(
        env=env,
        task_id=f"tw-simple/level{i % 5}/s{i % 60}",
        policy="smollm2-135m",
        messages=messages,
        sample=i // 60,
        split="train",
        token_ids=token_ids,
        loss_mask=mask,
        logprobs=logprobs,
        rewards=rewards,
        actions=actions,
        score=1.0 if success else round(rng.random() * 0.8, 2),
        success=success,
        turns=n,
        end_reason="terminated" if success or n < turns else "truncated",
        generated_tokens=sum(mask),
        timings={"generation": 1.0, "env": 0.01, "total": 1.1},
    )


def write_episodes(path: Path, count: int, turns: int = 6) -> WordDecoder:
    """Write ``count`` synthetic episodes to ``path``; return the decoder for their token ids."""
    tokens = WordDecoder()
    with TrajectoryWriter(path, fsync=False) as writer:
        for i in range(count):
            writer.write(synthetic_episode(i, tokens, turns))
    return tokens


def _timed(fn: Any, repeat: int = 5) -> tuple[float, Any]:
    """Median milliseconds of ``repeat`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times), result


def measure(path: Path, decoder: WordDecoder) -> dict[str, float]:
    """Milliseconds for the index build and the requests the page makes (see the docstring)."""
    from fastapi.testclient import TestClient

    from agentgym.viewer import create_app

    start = time.perf_counter()
    app = create_app(path, decoder=decoder)
    build_ms = (time.perf_counter() - start) * 1000
    with TestClient(app) as client:
        first_ms, first = _timed(lambda: client.get("/api/episodes?offset=0&limit=50").json())
        filtered_ms, filtered = _timed(
            lambda: client.get("/api/episodes?success=false&max_reward=0.5&offset=1000&limit=50").json()
        )
        episode_ms, _ = _timed(lambda: client.get("/api/episodes/9999").raise_for_status())
    return {
        "episodes": first["total"],
        "file_mb": round(path.stat().st_size / 1e6, 1),
        "index_build_ms": round(build_ms),
        "first_page_ms": round(first_ms, 1),
        "filtered_page_ms": round(filtered_ms, 1),
        "filtered_total": filtered["total"],
        "episode_ms": round(episode_ms, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trajectories.jsonl"
        decoder = write_episodes(path, args.episodes, args.turns)
        figures = measure(path, decoder)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
