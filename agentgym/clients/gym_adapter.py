"""A ``gymnasium.Env`` over a live AgentGym env server.

Importing this module registers ``agentgym/<name>-v0`` with Gymnasium for every
environment in :func:`agentgym.registry.names`, so::

    import gymnasium
    import agentgym.clients.gym_adapter  # noqa: F401 - registers the ids

    env = gymnasium.make("agentgym/textworld-v0", base_url="http://127.0.0.1:8101")
    observation, info = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("look")
    env.close()  # deletes the server session

Observations and actions are plain ``str``; ``info`` is the server's ``info`` unchanged
(``task_id``, ``turn``, ``score``, ``success``, and ``available_actions`` /
``expert_action`` where the environment provides them).
"""

from __future__ import annotations

import contextlib
from typing import Any

import gymnasium as gym
import httpx
from gymnasium import spaces

from agentgym import registry
from agentgym.clients.env_client import EnvClient
from agentgym.contract.core import MAX_ACTION_CHARS
from agentgym.contract.errors import UnknownSession

MAX_OBSERVATION_CHARS = 1 << 20
"""Upper bound of the observation space; real observations are far shorter."""
SEED_BOUND = 2**31
"""Seeds drawn for the server lie in [0, SEED_BOUND)."""


class AnyText(spaces.Text):
    """A :class:`~gymnasium.spaces.Text` space whose members are *any* ``str`` of allowed length.

    ``Text`` accepts only characters of its charset, but observations and actions are free
    text (newlines, punctuation, any unicode). Here the charset only feeds :meth:`sample`,
    which keeps Gymnasium's alphanumeric default so that a sampled action is never blank.
    """

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"AnyText({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyText) and super().__eq__(other)


def gym_id(env_name: str) -> str:
    """The Gymnasium id of an AgentGym environment, e.g. ``agentgym/textworld-v0``."""
    return f"agentgym/{env_name}-v0"


class AgentGymEnv(gym.Env[str, str]):
    """One server session seen as a Gymnasium environment.

    ``reset`` opens the session on first use and resets it afterwards; the task is
    ``options["task_id"]``, or task ``options["index"]`` of the split, or else the
    constructor's ``task_id``, or else a task of ``options.get("split", split)`` that the
    server draws with the seed. Without a ``seed``, one is drawn from ``self.np_random``,
    so ``reset(seed=s)`` followed by unseeded resets replays the same tasks. ``max_turns``
    overrides the server's turn limit per episode. ``close`` deletes the session.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        env_name: str,
        base_url: str | None = None,
        split: str = "train",
        task_id: str | None = None,
        token: str | None = None,
        max_turns: int | None = None,
    ) -> None:
        self.env_name = env_name
        self.base_url = base_url or _local_url(env_name)
        self.split = split
        self.task_id = task_id
        self.max_turns = max_turns
        self.observation_space = AnyText(MAX_OBSERVATION_CHARS, min_length=0)
        self._client = EnvClient(self.base_url, token=token)
        self._session_id: str | None = None
        self._action_space: AnyText | None = None

    @property
    def action_space(self) -> AnyText:  # type: ignore[override]
        """Text up to the server's ``max_action_chars`` (asked once, on first use: a
        Z-machine game takes 198, most envs 2000); 2000 where the server does not say."""
        if self._action_space is None:
            metadata = self._client.metadata()
            self._action_space = AnyText(metadata.max_action_chars or MAX_ACTION_CHARS)
        return self._action_space

    @action_space.setter
    def action_space(self, space: AnyText) -> None:
        self._action_space = space

    @property
    def session_id(self) -> str | None:
        """The server session behind this env (``None`` before the first reset)."""
        return self._session_id

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode (task chosen as in the class docstring); return ``(observation, info)``."""
        super().reset(seed=seed)
        if seed is None:
            seed = int(self.np_random.integers(SEED_BOUND))
        request = self._reset_request(seed, options)
        if self._session_id is not None:
            try:
                result = self._client.reset(self._session_id, **request)
                return result.observation, result.info
            except UnknownSession:
                # Idle past the server's TTL (or the server restarted): open a new session.
                self._session_id = None
        created = self._client.create(**request)
        self._session_id = created.session_id
        return created.observation, created.info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Play one action; server errors raise :mod:`agentgym.contract.errors` (e.g. ``EpisodeOver``)."""
        if self._session_id is None:
            raise gym.error.ResetNeeded("call reset() before step()")
        result = self._client.step(self._session_id, action)
        return result.observation, result.reward, result.terminated, result.truncated, result.info

    def close(self) -> None:
        """Delete the server session and close the connection pool. Idempotent."""
        if self._session_id is not None:
            # Already expired, or gone with its server: either way nothing is left to free.
            with contextlib.suppress(UnknownSession, httpx.TransportError):
                self._client.delete(self._session_id)
            self._session_id = None
        self._client.close()
        super().close()

    def _reset_request(self, seed: int, options: dict[str, Any] | None) -> dict[str, Any]:
        """Keyword arguments of ``EnvClient.create``/``reset`` for this reset."""
        options = dict(options or {})
        if "task_id" in options or "index" in options:
            task_id, index = options.pop("task_id", None), options.pop("index", None)
        else:
            task_id, index = self.task_id, None
        split = options.pop("split", self.split)
        if self.max_turns is not None:
            options.setdefault("max_turns", self.max_turns)
        return {"task_id": task_id, "split": split, "index": index, "seed": seed, "options": options or None}


def _local_url(env_name: str) -> str:
    """Where ``agentgym serve`` and ``agentgym up`` serve ``env_name`` on this machine by
    default (the port scheme, ``$AGENTGYM_BASE_PORT`` included)."""
    from agentgym.servers.launcher import default_port

    return f"http://127.0.0.1:{default_port(env_name)}"


def register_envs() -> list[str]:
    """Register ``agentgym/<name>-v0`` for every environment in the AgentGym registry.

    Idempotent: ids already known to Gymnasium are left alone. Call it again after
    ``agentgym.register(...)`` to expose a newly added environment. Returns all the ids.
    """
    ids = []
    for name in registry.names():
        env_id = gym_id(name)
        if env_id not in gym.registry:
            # No max_episode_steps: the server truncates at its own turn limit.
            gym.register(env_id, entry_point=f"{__name__}:AgentGymEnv", kwargs={"env_name": name})
        ids.append(env_id)
    return ids


register_envs()
