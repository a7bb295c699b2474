"""``python -m agentgym.demo``: the README's first command.

Starts a local textworld server (a real subprocess on loopback), then plays one test
task over REST with the Python client, following the environment's expert, and prints
every turn. Later milestones turn this into a training run.
"""

from __future__ import annotations

import sys

from rich.panel import Panel

from agentgym.clients.env_client import EnvClient
from agentgym.progress import make_console
from agentgym.servers.launcher import start_server_process, wait_healthy

console = make_console()


def play_expert_episode(url: str, split: str = "test", index: int = 0) -> bool:
    with EnvClient(url) as client:
        meta = client.metadata()
        console.print(
            f"[bold]{meta.name}[/] v{meta.version}: splits {meta.splits}, max {meta.max_turns} turns"
        )
        created = client.create(split=split, index=index)
        info = created.info
        console.print(Panel(created.observation.strip(), title=f"task {info['task_id']}"))
        try:
            while info.get("expert_action"):
                action = info["expert_action"]
                result = client.step(created.session_id, action)
                info = result.info
                console.print(
                    f"[cyan]> {action}[/]   reward {result.reward:+.2f}   score {info['score']:.2f}"
                )
                console.print(result.observation.strip(), style="dim")
                if result.terminated or result.truncated:
                    break
        finally:
            client.delete(created.session_id)
    outcome = "[green]won[/]" if info["success"] else "[red]not won[/]"
    console.print(f"episode over after {info['turn']} turns: {outcome}, score {info['score']:.2f}")
    return bool(info["success"])


def main() -> int:
    server = start_server_process("textworld", extra_args=["--log-level", "warning"])
    try:
        with console.status(f"starting the textworld server at {server.url} ..."):
            wait_healthy(server.url, timeout=180, process=server.process)
        console.print(f"textworld server up at {server.url} (pid {server.process.pid})")
        return 0 if play_expert_episode(server.url) else 1
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
