"""Typed models of wire API v1, shared by the server and the clients.

Request models forbid unknown fields so that a typo (``"acton"``) is a clear 422, not a
silently ignored key. Response models are what the server returns and what the clients
parse; they allow extra fields so that newer servers stay readable by older clients.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Response(BaseModel):
    model_config = ConfigDict(extra="allow")


# ----- requests ------------------------------------------------------------------------


class CreateSessionRequest(_Request):
    """Start a session on ``task_id``, or on task ``index`` of ``split``, or (neither)
    on a task of ``split`` drawn with ``seed``."""

    task_id: str | None = None
    split: str | None = None
    index: int | None = Field(default=None, ge=0)
    seed: int | None = None
    options: dict[str, Any] | None = None


class ResetRequest(_Request):
    task_id: str | None = None
    split: str | None = None
    index: int | None = Field(default=None, ge=0)
    seed: int | None = None
    options: dict[str, Any] | None = None


class StepRequest(_Request):
    action: StrictStr


# ----- responses -----------------------------------------------------------------------


class ErrorDetail(BaseModel):
    code: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorDetail


class Health(_Response):
    status: str
    env: str
    sessions: int
    capacity: int


class Metadata(_Response):
    name: str
    version: str
    description: str
    instruction: str
    action_format: str
    max_action_chars: int | None = None
    """Longest action the env takes, in characters (older servers do not say)."""
    splits: dict[str, int]
    max_turns: int
    reward_range: list[float]


class TaskInfo(_Response):
    task_id: str
    split: str


class TaskList(_Response):
    tasks: list[TaskInfo]
    total: int


class SessionCreated(_Response):
    session_id: str
    observation: str
    info: dict[str, Any]


class ResetResult(_Response):
    observation: str
    info: dict[str, Any]


class StepResult(_Response):
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class SessionState(_Response):
    session_id: str
    task_id: str | None
    turn: int
    done: bool
    observation: str
    info: dict[str, Any]
    created_at: float
    last_active: float
