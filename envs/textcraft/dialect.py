"""The dialect of AgentGym's TextCraft server (agentenv-textcraft), for its client."""

from __future__ import annotations

from typing import Any

from agentgym.contract.dialects import Dialect, closed_true


def _created(compat_id: int, observation: str) -> dict[str, Any]:
    """Its ``/create`` starts an episode and answers it; the client reads ``id`` and ``observation``."""
    return {"id": compat_id, "observation": observation, "done": False, "reward": 0}


TEXTCRAFT_DIALECT = Dialect(
    # /create's body ({minecraft_dir, commands, goal}) is read by AgentGym's server and then
    # unused: it resets to its own goal at once. Ours does too (task 0 in data_idx order).
    create_starts=_created,
    close=closed_true,
    getters={"commands": "commands", "goal": "goal", "detail": "detail"},
)
