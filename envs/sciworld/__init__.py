"""ScienceWorld environment: 30 science task types on a pooled JVM engine (see docs/envs/sciworld.md)."""

from agentgym.envs.sciworld.env import SciWorldEnv

__all__ = ["SciWorldEnv"]
