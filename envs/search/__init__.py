"""Search environment: multi-hop question answering over a BM25 index (see envs/search/README.md)."""

from agentgym.envs.search.env import SearchEnv

__all__ = ["SearchEnv"]
