"""ScienceWorld environment: 30 science task types on a pooled JVM engine (see envs/sciworld/README.md)."""

from agentgym.envs.sciworld.env import SciWorldEnv

__all__ = ["SciWorldEnv"]
