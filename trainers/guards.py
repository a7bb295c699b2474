"""Collapse guards: warnings when RL starts to go wrong, while there is time to stop it.

Two failures show up in the metrics before held-out success falls: the policy's entropy
collapsing (it stops exploring; every sample of a group agrees, advantages vanish) and
the share of invalid actions climbing (the policy drifts off the commands the env takes).
The guard compares each RL step with thresholds and with the first RL step, logs a
warning, and returns it for the step's metrics record (the dashboard lists them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class CollapseGuard:
    entropy_floor: float
    """Warn when the mean token entropy (nats) of an update falls below this."""
    invalid_rise: float
    """Warn when the invalid-action share exceeds the first RL step's by more than this."""
    first_invalid_share: float | None = field(default=None, init=False)

    def check(self, record: dict[str, Any]) -> list[str]:
        """Warnings for one RL step's metrics record (none for other phases)."""
        if record.get("phase") != "rl":
            return []
        warnings = []
        entropy = record.get("entropy")
        if entropy is not None and entropy < self.entropy_floor:
            warnings.append(
                f"entropy collapse: token entropy {entropy:.3f} nats is below {self.entropy_floor}"
            )
        invalid = record.get("invalid_share")
        if invalid is not None:
            if self.first_invalid_share is None:
                self.first_invalid_share = invalid
            elif invalid - self.first_invalid_share > self.invalid_rise:
                warnings.append(
                    f"invalid actions climbing: {invalid:.0%} of turns, "
                    f"{self.first_invalid_share:.0%} at the first RL step"
                )
        for warning in warnings:
            log.warning("step %s: %s", record.get("step"), warning)
        return warnings
