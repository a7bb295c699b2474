"""The trajectory record (docs/trajectories.md), its crash-safe JSONL store, and
import/export of AgentGym's conversation format.

One :class:`Trajectory` per episode. Token fields are set for token-level policies only
(``None`` for text backends); ``token_ids``, ``loss_mask``, ``logprobs`` and ``versions``
always have equal length, ``loss_mask`` is 1 exactly on sampled tokens, ``logprobs`` holds
their behaviour log-probs (0.0 on other positions) and ``versions`` the policy weights
version that sampled each of them (-1 on other positions). Episodes that ended in an error are kept,
marked by ``end_reason = "error:<kind>"``; readers that train must skip them
(:attr:`Trajectory.errored`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
"""The version of the record written here, ``schema_version`` in every record. Raised when a
field changes meaning or goes away; new fields alone keep it (readers ignore unknown keys).
Records from before versioning read as version 0."""

AGENTGYM_ACK = "OK. I'll follow your instructions and try my best to solve the task."
"""AgentGym's conversations open with the instruction as a human turn and this untrained
reply; export writes it after the system prompt and import drops it again."""


@dataclass
class Trajectory:
    """One episode. See ``docs/trajectories.md`` for every field's contract."""

    env: str
    task_id: str
    policy: str
    """Model id or alias of the policy that acted."""
    messages: list[dict[str, Any]]
    """``{"role", "content", "loss"}``: system prompt, observations (user) and replies
    (assistant, ``loss`` true). Replies are the decoded sampled tokens for token backends."""
    sample: int = 0
    """Which of the k samples of this task (eval's resume key is ``(task_id, sample)``)."""
    split: str | None = None
    seed: int | None = None
    """Seed passed to the environment's reset."""
    format: str = "react"
    """Agent format the replies were parsed with."""
    token_ids: list[int] | None = None
    loss_mask: list[int] | None = None
    logprobs: list[float] | None = None
    versions: list[int] | None = None
    """The policy version that sampled each token (-1 on tokens not sampled, and on sampled
    tokens when the backend does not know); same length as ``token_ids``. Records written
    before this field existed read as ``None``."""
    reply_choices: list[list[list[int]]] | None = None
    """One entry per agent turn (run of loss-mask 1 tokens): the token sequences a
    constrained reply was allowed to become, [] for a free reply. ``logprobs`` of a
    constrained turn are under that mask, and a learner scores the turn under it too.
    ``None``: no turn was constrained, or a record written before this field existed."""
    rewards: list[float] = field(default_factory=list)
    """One per turn; 0.0 for a turn whose reply did not parse (the env was not stepped)."""
    actions: list[str | None] = field(default_factory=list)
    """One per turn: the action sent, or ``None`` when the reply did not parse."""
    score: float = 0.0
    """Task progress in [0, 1] at the end (the env's ``info.score``)."""
    shaped_score: float | None = None
    """A training run's own reward for the episode (its reward hook), which its advantages
    read in place of ``score``; None where no hook was set."""
    success: bool = False
    turns: int = 0
    """Agent turns played (replies generated), parse failures included."""
    invalid_turns: int = 0
    """Turns whose reply did not parse, whose action the env refused, or whose action is not
    among the valid commands the env listed."""
    end_reason: str = "truncated"
    """``terminated`` (task won or lost), ``truncated`` (turn limit), ``context_full`` (the
    next reply would not fit the context limit) or ``error:<kind>``."""
    error: str | None = None
    """The error message when ``end_reason`` is an error."""
    template_drift: bool = False
    """The chat template renders earlier turns differently from the tokens recorded."""
    generated_tokens: int | None = None
    """Sampled tokens in total (token backends)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds: ``generation`` (awaiting the policy), ``env`` (awaiting the server), ``total``."""
    schema_version: int = SCHEMA_VERSION
    """The record format (:data:`SCHEMA_VERSION` when written by this code)."""

    @property
    def errored(self) -> bool:
        return self.end_reason.startswith("error:")

    @property
    def key(self) -> tuple[str, int]:
        return (self.task_id, self.sample)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Trajectory:
        """Build from a record; keys this version does not know are ignored (newer writers),
        and a record without ``schema_version`` is version 0 (written before versioning)."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{"schema_version": 0} | {k: v for k, v in data.items() if k in known})


# ----- JSONL store ----------------------------------------------------------------------


class TrajectoryWriter:
    """Appends one JSON line per record and flushes (and fsyncs) it at once, so a crash
    loses at most the line being written. Opening an existing file first cuts a torn last
    line left by a crash, so the next record does not glue onto it."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _cut_torn_tail(self.path)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._fsync = fsync

    def write(self, record: Trajectory | dict[str, Any]) -> None:
        data = record.to_dict() if isinstance(record, Trajectory) else record
        self._file.write(json.dumps(data, ensure_ascii=False) + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _cut_torn_tail(path: Path) -> None:
    """Truncate an unterminated last line (a write cut short by a crash)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return
        keep = data.rfind(b"\n") + 1
        log.warning(
            "%s: dropping a torn last line (%d bytes) left by an interrupted write", path, len(data) - keep
        )
        handle.truncate(keep)


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """The records of a JSONL file. A last line that does not parse (torn by a crash) is
    skipped with a warning; a bad line anywhere else raises ``ValueError``."""
    with open(path, encoding="utf-8") as handle:
        lines = handle.read().split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                log.warning("%s: ignoring a torn last line %d (%s)", path, number, exc.msg)
                return
            raise ValueError(f"{path}:{number}: not a JSON record ({exc.msg})") from None


STEP_FILE_RE = re.compile(r"step-0*(\d+)\.jsonl$")
"""A run's ``rollouts/step-000012.jsonl`` holds the episodes of training step 12."""
OTHER_JSONL = frozenset({"metrics.jsonl"})
"""JSONL files of a run folder that never hold trajectories."""


def is_trajectory_record(record: Any) -> bool:
    return isinstance(record, dict) and "messages" in record and "task_id" in record


def sniff_trajectory_file(path: Path) -> bool:
    """Whether the first non-empty line of ``path`` is a trajectory record."""
    with open(path, "rb") as handle:
        for line in handle:
            if line.strip():
                try:
                    return is_trajectory_record(json.loads(line))
                except ValueError:
                    return False
    return False


def step_of(path: Path) -> int | None:
    """The training step of a run's ``step-N.jsonl`` rollout file, else ``None``."""
    match = STEP_FILE_RE.search(path.name)
    return int(match.group(1)) if match else None


def jsonl_files(root: Path) -> list[Path]:
    """``root`` itself when it is a file; else the JSONL files under it that may hold
    trajectories (rollout steps in numeric order first, then the rest by path)."""
    if root.is_file():
        return [root]
    found = [p for p in root.rglob("*.jsonl") if p.name not in OTHER_JSONL and p.is_file()]
    return sorted(found, key=lambda p: (step_of(p) is None, step_of(p) or 0, str(p)))


def trajectory_files(root: Path) -> list[Path]:
    """The trajectory JSONL files of a run or eval folder (or the one file ``root``)."""
    return [path for path in jsonl_files(root) if sniff_trajectory_file(path)]


def read_trajectories(path: str | os.PathLike[str]) -> list[Trajectory]:
    return [Trajectory.from_dict(record) for record in read_jsonl(path)]


def write_trajectories(path: str | os.PathLike[str], records: Iterable[Trajectory | dict[str, Any]]) -> None:
    with TrajectoryWriter(path) as writer:
        for record in records:
            writer.write(record)


# ----- AgentGym conversation format -----------------------------------------------------


def to_agentgym(trajectory: Trajectory) -> dict[str, Any]:
    """``{"conversations": [{"from", "value", "loss"}], "item_id": "<env>_<task_id>"}``.
    AgentGym has no system role: the system prompt becomes the first human turn followed
    by :data:`AGENTGYM_ACK` (``loss`` false); human turns carry ``loss: null`` as in
    AgentGym's data, agent turns their ``loss`` flag."""
    conversations: list[dict[str, Any]] = []
    for i, message in enumerate(trajectory.messages):
        if message["role"] == "assistant":
            conversations.append(
                {"from": "gpt", "loss": bool(message.get("loss", True)), "value": message["content"]}
            )
            continue
        conversations.append({"from": "human", "loss": None, "value": message["content"]})
        following = trajectory.messages[i + 1] if i + 1 < len(trajectory.messages) else None
        if message["role"] == "system" and (following is None or following["role"] != "assistant"):
            conversations.append({"from": "gpt", "loss": False, "value": AGENTGYM_ACK})
    return {"conversations": conversations, "item_id": f"{trajectory.env}_{trajectory.task_id}"}


def from_agentgym(item: dict[str, Any], *, policy: str = "agentgym") -> Trajectory:
    """A text-only :class:`Trajectory` (no tokens, outcome unknown) from an AgentGym record.
    A leading human turn answered by an untrained gpt turn is the instruction: it becomes
    the system prompt, and the answer is dropped when it is :data:`AGENTGYM_ACK`."""
    conversations = list(item["conversations"])
    messages: list[dict[str, Any]] = []
    if len(conversations) >= 2 and conversations[0]["from"] == "human" and _untrained_gpt(conversations[1]):
        messages.append({"role": "system", "content": conversations[0]["value"], "loss": False})
        conversations = conversations[2:] if conversations[1]["value"] == AGENTGYM_ACK else conversations[1:]
    for turn in conversations:
        gpt = turn["from"] == "gpt"
        role = "assistant" if gpt else "user"
        messages.append({"role": role, "content": turn["value"], "loss": bool(turn.get("loss")) and gpt})
    env, _, task_id = str(item.get("item_id", "")).partition("_")
    replies = sum(m["role"] == "assistant" and m["loss"] for m in messages)
    return Trajectory(
        env=env, task_id=task_id, policy=policy, messages=messages, turns=replies, end_reason="imported"
    )


def _untrained_gpt(turn: dict[str, Any]) -> bool:
    return turn["from"] == "gpt" and turn.get("loss") is False
