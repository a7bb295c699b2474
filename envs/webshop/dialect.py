"""The dialect of AgentGym's WebShop server (agentenv-webshop), for its client."""

from __future__ import annotations

from typing import Any

from agentgym.contract.dialects import Dialect, bare_id


def _step_fields(observation: str) -> dict[str, Any]:
    return {"state": observation}  # AgentGym's WebShop server names the observation "state"


def _reset(observation: str) -> list[Any]:
    return [observation, None]  # its response_model is Tuple[str, None]


def _clickables(actions: list[str]) -> dict[str, Any]:
    """WebShop's ``get_available_actions()`` from our action strings (``search[<query>]``
    while the search bar shows, then ``click[element]`` per clickable, in page order)."""
    return {
        "has_search_bar": any(a.startswith("search[") for a in actions),
        "clickables": [a[len("click[") : -1] for a in actions if a.startswith("click[")],
    }


WEBSHOP_DIALECT = Dialect(
    # a bare N; session_id is the goal index (WebShop numbers test goals first)
    create=bare_id,
    task_field="session_id",
    task_order=("test", "train"),
    native_reset=_reset,
    step_fields=_step_fields,
    available_actions=_clickables,
)
