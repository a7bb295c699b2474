"""WebShop environment: shop for a product that fits an instruction, in text mode or in a
real browser on the shop's website (see envs/webshop/README.md)."""

from agentgym.envs.webshop.env import WebShopEnv

__all__ = ["WebShopEnv"]
