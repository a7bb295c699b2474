"""Critique-RL (``algo: critique-rl``; docs/algorithms/critique-rl.md): its settings and
their checks (``settings.py``, light: the config reads them) and the regime the trainer runs
(``regime.py``)."""
