"""Clients of an env server: wire API v1 (``env_client``: ``EnvClient``, ``AsyncEnvClient``), an
MCP server (``mcp_client``), an OpenEnv environment (``openenv_client``, ``openenv_tools``),
and a ``gymnasium.Env`` over any of ours (``gym_adapter``)."""
