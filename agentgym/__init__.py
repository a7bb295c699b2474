"""AgentGym: LLM agents in interactive text environments."""

from agentgym.core import Task, TextEnv, Transition
from agentgym.registry import make, names, register

__version__ = "0.1.0"
__all__ = ["Task", "TextEnv", "Transition", "__version__", "make", "names", "register"]
