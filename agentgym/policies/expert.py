"""``ExpertPolicy``: replays the environment's own expert action.

The rollout puts the expert's next action into ``request.info["expert_action"]`` (from
the environment's ``info``); this policy returns it verbatim. It is format-agnostic:
the rollout knows the policy is the expert and uses the text as the action without
parsing it. Useful as an upper bound in evaluation and as behaviour-cloning data.
"""

from __future__ import annotations

from agentgym.policies.base import Generation, GenerationRequest, SamplingParams


class ExpertPolicy:
    """Text policy whose reply is ``request.info["expert_action"]``."""

    name = "expert"
    tokenizer = None

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingParams) -> list[Generation]:
        """Each request's expert action; ``KeyError`` when the harness did not supply one."""
        return [Generation(text=_expert_action(request)) for request in requests]

    async def close(self) -> None:
        """Nothing to release."""


def _expert_action(request: GenerationRequest) -> str:
    action = request.info.get("expert_action")
    if not isinstance(action, str):
        raise KeyError(
            "the expert policy needs request.info['expert_action'] (a string); "
            "this environment or task provides no expert action"
        )
    return action
