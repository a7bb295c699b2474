"""Environments: one sub-package each, registered in agentgym.registry."""
