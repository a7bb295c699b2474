"""The HTTP layer: app factory, session manager, AgentGym-compatible routes, launcher."""
