"""The dialect of AgentGym's BabyAI server (agentenv-babyai), for its client.

It answers ``/create`` with ``{"id": N}``, reads ``id`` and ``data_idx``, and its
``/reset`` and ``/step`` objects carry ``observation``, ``reward``, ``score`` and
``done`` as ours do; only ``/close`` differs: a bare ``true``.
"""

from __future__ import annotations

from agentgym.contract.dialects import Dialect, closed_true

BABYAI_DIALECT = Dialect(close=closed_true)
