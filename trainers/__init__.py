"""Training: algorithms as pure functions, schedules, the trainer loop.

``from agentgym.trainers import train, TrainConfig`` is the Python API (:mod:`.api`); both
load on first use, so importing a light part (``agentgym.trainers.presets``) stays light.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "train":
        from agentgym.trainers.api import train

        return train
    if name == "TrainConfig":
        from agentgym.trainers.config import TrainConfig

        return TrainConfig
    raise AttributeError(f"module 'agentgym.trainers' has no attribute {name!r}")
