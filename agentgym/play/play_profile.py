"""How a model is played: one type for the settings a run's held-out evaluation used, the
ones ``eval`` and :func:`agentgym.api.evaluate` play with, and the run folder's record of
them (``play.json``, beside the format in :mod:`agentgym.records.run_folder`).

A trained model is played as it was trained (its reply format and length, the valid
commands shown or constrained, the turn limit); any other model gets :class:`PlayProfile`'s
defaults. The trainer writes the record (:meth:`PlayProfile.of_rollout`), ``export``
copies it, and evaluation reads it back (:func:`read_play`), fits it to the policy kind that
plays (:meth:`PlayProfile.for_policy`), lays the caller's own settings over it
(:meth:`PlayProfile.overridden`) and turns it into episodes' :class:`RolloutConfig`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentgym.agents import ACTION_ORDERS, FORMATS
from agentgym.contract.errors import UsageError
from agentgym.play.episode import RolloutConfig
from agentgym.policies import CONSTRAINING_KINDS
from agentgym.policies.base import SamplingParams
from agentgym.policies.runs import record_folder
from agentgym.records.run_folder import PLAY_FILE, atomic_write_text, read_json_object


@dataclass(frozen=True)
class PlayProfile:
    """How episodes are played by a model; the defaults are how a model that is not a
    training run plays, where nothing says otherwise."""

    agent_format: str = "react"
    max_new_tokens: int = 128
    max_turns: int | None = None
    """None: the env's limit."""
    show_actions: bool = False
    action_order: str = "hashed"
    constrain_actions: bool = False
    temperature: float | None = None
    """Recorded by the trainer (its held-out evaluation is greedy); a caller that leaves the
    temperature out samples greedily for one sample a task, at 1 for several."""
    dtype: str | None = None
    """The dtype the run trained and was evaluated in (records from before it lack it)."""

    @classmethod
    def settings(cls) -> tuple[str, ...]:
        """What a caller may set (``eval``'s options, ``evaluate(play=...)``'s keys)."""
        return tuple(f.name for f in dataclasses.fields(cls) if f.name not in ("temperature", "dtype"))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> PlayProfile:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in record.items() if key in names})

    def record(self) -> dict[str, Any]:
        """The run folder's record: every setting and the temperature; the dtype where known."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "dtype" or v is not None}

    @classmethod
    def of_rollout(cls, rollout: RolloutConfig, dtype: str | None = None) -> PlayProfile:
        return cls(
            agent_format=rollout.format,
            max_new_tokens=rollout.sampling.max_new_tokens,
            max_turns=rollout.max_turns,
            show_actions=rollout.show_actions,
            action_order=rollout.action_order,
            constrain_actions=rollout.constrain_actions,
            temperature=rollout.sampling.temperature,
            dtype=dtype,
        )

    def overridden(self, given: Mapping[str, Any] | None) -> PlayProfile:
        """This profile with the ``given`` settings that are not None; ``UsageError`` for a
        name that is not a setting."""
        given = {key: value for key, value in (given or {}).items() if value is not None}
        if unknown := set(given) - set(self.settings()):
            raise UsageError(
                f"unknown play settings {', '.join(sorted(unknown))}; they are {', '.join(self.settings())}"
            )
        return dataclasses.replace(self, **given)

    def for_policy(self, kind: str) -> PlayProfile:
        """This (recorded) profile for a policy of kind ``kind``: one that cannot constrain its
        replies (an OpenAI-compatible server decodes freely) is shown the valid commands the
        run was constrained to, and picks among them by itself (a trained model ends its reply)."""
        if self.constrain_actions and kind not in CONSTRAINING_KINDS:
            return dataclasses.replace(self, constrain_actions=False, show_actions=True)
        return self

    def rollout(
        self, kind: str, *, concurrency: int, temperature: float, history_turns: int | None = None
    ) -> RolloutConfig:
        """How a policy of kind ``kind`` plays episodes by this profile; ``UsageError`` for
        an unknown format or order, or constrained decoding asked of a kind that has none."""
        if self.agent_format not in FORMATS:
            raise UsageError(f"unknown agent format {self.agent_format!r}; formats are {', '.join(FORMATS)}")
        if self.action_order not in ACTION_ORDERS:
            raise UsageError(
                f"unknown action order {self.action_order!r}; orders are {', '.join(ACTION_ORDERS)}"
            )
        if self.constrain_actions and kind not in CONSTRAINING_KINDS:
            raise UsageError(
                f"constrain_actions needs policy {' or '.join(CONSTRAINING_KINDS)} "
                "(--constrain-actions; the others decode unconstrained)"
            )
        return RolloutConfig(
            max_turns=self.max_turns,
            concurrency=concurrency,
            sampling=SamplingParams(temperature=temperature, max_new_tokens=self.max_new_tokens),
            format=self.agent_format,
            history_turns=history_turns,
            show_actions=self.show_actions or self.constrain_actions,
            action_order=self.action_order,
            constrain_actions=self.constrain_actions,
        )

    def described(self) -> str:
        return ", ".join(f"{name} {getattr(self, name)}" for name in self.settings())


def write_play(folder: Path, profile: PlayProfile) -> None:
    """Record how ``folder``'s model is played."""
    atomic_write_text(Path(folder) / PLAY_FILE, json.dumps(profile.record(), indent=1) + "\n")


def read_play(folder: Path) -> PlayProfile | None:
    """``folder``'s play record, or None where it has none (or an unreadable or partial one)."""
    record = read_json_object(Path(folder) / PLAY_FILE)
    required = {*PlayProfile.settings(), "temperature"}
    return PlayProfile.from_record(record) if record is not None and required <= set(record) else None


def played_by(spec: str | Path | None) -> PlayProfile | None:
    """How the training run or exported model ``spec`` played its held-out evaluations (its
    play record); None for any other model, and for a run from before the play record
    (:func:`agentgym.api.recorded_play` reads those from their config)."""
    folder = record_folder(spec)
    return read_play(folder) if folder is not None else None
