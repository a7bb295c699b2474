"""Launched in place of ``python -m agentgym.trainers.trl_engine.run RUN_DIR`` by
tests/test_trl.py (``agentgym train --engine trl --nproc 2`` builds the ``accelerate
launch`` command): the same entry point, with every optimizer step of this rank recorded
into ``RUN_DIR/rank-R.pt``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from test_trl import Recorded

from agentgym.trainers.trl_engine import run

if __name__ == "__main__":
    recorded = Recorded(pytest.MonkeyPatch())
    run.main()
    torch.save(recorded.steps, Path(sys.argv[1]) / f"rank-{os.environ['RANK']}.pt")
