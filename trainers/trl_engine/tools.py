"""TRL's ``environment_factory`` over our env servers, for models that call tools.

``GRPOTrainer(environment_factory=...)`` makes one object per rollout (pooled, reset
between rollouts), calls ``reset(**row)`` with the dataset row, offers the object's public
methods to the model as tools, masks the tools' answers from the loss, and scores the
rollout with ``get_reward()``. :class:`EnvSession` is that object for any env server: the
row's ``task_id`` is a train task, ``reset`` opens a session on it over our REST API (the
wire API every built-in env serves, so no adapter stands between TRL and the env), ``act``
plays one command, ``get_reward`` is the env's score of the episode, as our rollouts record
it. The horizon (ScalingInter-RL's turn limit for the current TRL step) is enforced here:
the command that reaches it ends the episode.

This is the path for models that call tools through their chat template (TRL parses the
calls); models that cannot, such as the default SmolLM2-135M, train through
``rollout_func`` (``episodes.py``), which plays with our rollout engine.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agentgym.agents.history import with_actions
from agentgym.clients.env_client import EnvClient

INSTRUCTION = "Play the task below with the act tool, one command a call, until it is won.\n\n"
"""The user turn of every rollout; TRL appends the first observation (``reset``'s) to it."""


class EnvSession:
    """One episode at a time on the env server at ``url``; ``horizon()`` gives the turn
    limit of the rollout about to start (read at each ``reset``). TRL offers every public
    method but ``reset`` and ``get_reward`` to the model as a tool: helpers stay private."""

    def __init__(
        self,
        url: str,
        horizon: Callable[[], int],
        *,
        token: str | None = None,
        split: str = "train",
        action_order: str = "hashed",
    ) -> None:
        self.client = EnvClient(url, token=token)
        self.horizon, self.split, self.action_order = horizon, split, action_order
        self.session_id: str | None = None
        self.task_id: str | None = None
        self.turns, self.max_turns, self.score, self.over = 0, 0, 0.0, True

    def reset(self, task_id: str, **_: Any) -> str:
        """Start the episode of train task ``task_id`` (a column of the dataset row); its first
        observation, with the valid commands where the env lists them."""
        self._end()
        created = self.client.create(task_id, split=self.split)
        self.session_id, self.task_id = created.session_id, task_id
        self.turns, self.max_turns, self.over = 0, self.horizon(), False
        self.score = float(created.info.get("score", 0.0))
        return self._shown(created.observation, created.info)

    def act(self, command: str) -> str:
        """Play one command in the environment and read what happens next.

        Args:
            command: The command to play, as the environment words it (one of the valid commands when they are listed).
        """
        if self.over:
            raise ValueError("the episode is over: no more commands")
        result = self.client.step(self.session_id, command)
        self.turns += 1
        self.score = float(result.info.get("score", self.score))
        if result.terminated or result.truncated or self.turns >= self.max_turns:
            self._end()
            return f"{result.observation}\n\nThe episode is over."
        return self._shown(result.observation, result.info)

    def get_reward(self) -> float:
        """The env's score of the episode (task progress in [0, 1])."""
        return self.score

    def _shown(self, observation: str, info: dict[str, Any]) -> str:
        return with_actions(observation, info.get("available_actions"), self.action_order)

    def _end(self) -> None:
        """Delete the session now: the server holds no episode TRL has finished with."""
        self.over = True
        if self.session_id is not None:
            session, self.session_id = self.session_id, None
            self.client.delete(session)
