"""``babyai``: BabyAI's grid-world levels (minigrid) in words, with AgentGym's command set."""

from agentgym.envs.babyai.env import BabyAIEnv

__all__ = ["BabyAIEnv"]
