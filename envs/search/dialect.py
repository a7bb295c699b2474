"""The dialect of AgentGym's SearchQA server (agentenv-searchqa), for its client."""

from __future__ import annotations

from agentgym.contract.dialects import Dialect, bare_id, closed_true


def _reset(observation: str) -> str:
    return observation


SEARCHQA_DIALECT = Dialect(
    # a bare N; /create and /reset carry the item index as id (test items first)
    create=bare_id,
    task_field="id",
    task_order=("test", "train"),
    native_reset=_reset,
    close=closed_true,
    create_loads_task=True,
)
