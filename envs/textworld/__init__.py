"""TextWorld environment: generated text adventures (see envs/textworld/README.md)."""

from agentgym.envs.textworld.env import TextWorldEnv

__all__ = ["TextWorldEnv"]
