"""TextWorld environment: generated text adventures (see docs/envs/textworld.md)."""

from agentgym.envs.textworld.env import TextWorldEnv

__all__ = ["TextWorldEnv"]
