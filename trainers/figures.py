"""The figures a step's metrics record carries about the episodes it played."""

from __future__ import annotations

import time
from typing import Any

from agentgym.records.trajectory import Trajectory


def rollout_stats(episodes: list[Trajectory]) -> dict[str, Any]:
    finished = [e for e in episodes if not e.errored]
    shaped = [e.shaped_score for e in finished if e.shaped_score is not None]
    generated, turns = sum(e.generated_tokens or 0 for e in finished), sum(e.turns for e in finished)
    return {
        "episodes": len(episodes),
        "errored": len(episodes) - len(finished),
        "success_rate": average(float(e.success) for e in finished),
        "reward_mean": average(e.score for e in finished),
        **({"shaped_reward_mean": average(shaped)} if shaped else {}),
        "turns_mean": average(e.turns for e in finished),
        "invalid_share": _share(sum(e.invalid_turns for e in finished), turns),
        "context_full": sum(e.end_reason == "context_full" for e in finished),
        "generated_tokens": generated,
        "reply_tokens_mean": _share(generated, turns),
        # Summed over concurrent episodes: their ratio splits the rollout's wall time.
        "generation_s_sum": round(sum(e.timings.get("generation", 0.0) for e in finished), 2),
        "env_s_sum": round(sum(e.timings.get("env", 0.0) for e in finished), 2),
    }


def _share(part: float, whole: float) -> float:
    return round(part / whole, 4) if whole else 0.0


def average(values: Any) -> float:
    values = list(values)
    return float(sum(values) / len(values)) if values else 0.0


def seconds_since(start: float) -> float:
    return round(time.perf_counter() - start, 2)
