"""Test envs hosted in engine worker processes (``engine_process``). A worker imports this
module by name (the tests folder is on its ``sys.path``), so it must stay light."""

from __future__ import annotations

import ctypes
import time
from typing import ClassVar

from agentgym.contract.core import Transition
from agentgym.envs.choice import ChoiceEnv


class FaultyWorkerEnv(ChoiceEnv):
    """``choice`` in a worker process whose engine hangs on ``hang`` (as jericho did on
    ``\\hello``, in C code no thread can be stopped in) and segfaults on ``segfault`` (as
    jericho did on a NUL)."""

    name: ClassVar[str] = "faulty-worker-choice"
    engine_process: ClassVar[bool] = True
    mirrored_attributes: ClassVar[tuple[str, ...]] = ("answer",)

    def _step(self, action: str) -> Transition:
        if action == "hang":
            time.sleep(3600)
        if action == "segfault":
            ctypes.string_at(0)  # reads address 0: SIGSEGV
        return super()._step(action)
