"""WebShop environment: shop for a product that fits an instruction, in text mode or in a
real browser on the shop's website (see docs/envs/webshop.md)."""

from agentgym.envs.webshop.env import WebShopEnv

__all__ = ["WebShopEnv"]
