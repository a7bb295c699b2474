"""``python -m agentgym.cli``."""

from agentgym.cli import main

main()
