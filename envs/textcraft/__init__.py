"""TextCraft environment: Minecraft crafting goals (see envs/textcraft/README.md)."""

from agentgym.envs.textcraft.env import TextCraftEnv

__all__ = ["TextCraftEnv"]
