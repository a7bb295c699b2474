"""AgentGym: LLM agents in interactive text environments."""

from agentgym import moved
from agentgym.contract.core import Task, TextEnv, Transition
from agentgym.registry import make, names, register

moved.install()

__version__ = "0.1.0"
__all__ = ["Task", "TextEnv", "Transition", "__version__", "make", "names", "register"]
