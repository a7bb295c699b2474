"""Module paths of earlier versions, still importable: ``import agentgym.core`` gives the very
module ``agentgym.contract.core`` (one object, so ``isinstance`` and pickles agree), imported
only when first asked for. Envs, plugins and scripts written against the flat layout keep
working; new code uses the sub-packages."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

MOVED = {
    f"agentgym.{old}": f"agentgym.{new}"
    for old, new in {
        "core": "contract.core",
        "errors": "contract.errors",
        "inputs": "contract.inputs",
        "cache": "contract.cache",
        "sites": "contract.sites",
        "problems": "contract.problems",
        "dialects": "contract.dialects",
        "client": "clients.env_client",
        "mcp_client": "clients.mcp_client",
        "openenv_client": "clients.openenv_client",
        "openenv_tools": "clients.openenv_tools",
        "gym_adapter": "clients.gym_adapter",
        "episode": "play.episode",
        "rollout": "play.rollout",
        "evaluation": "play.evaluation",
        "play_profile": "play.play_profile",
        "critique": "play.critique",
        "critic_eval": "play.critic_eval",
        "run_folder": "records.run_folder",
        "trajectory": "records.trajectory",
        "trajectory_table": "records.trajectory_table",
        "curves": "records.curves",
        "checker": "conformance.runner",
        "checks": "conformance.checks",
    }.items()
}
"""Earlier path -> where the module lives now."""


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an earlier path and hands back the module at its new one."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        return importlib.machinery.ModuleSpec(name, self) if name in MOVED else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])  # its own name and spec are kept

    def exec_module(self, module: ModuleType) -> None:
        """Already executed under its new name."""


def install() -> None:
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(MovedModules())
