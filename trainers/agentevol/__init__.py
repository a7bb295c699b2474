"""AgentEvol (``algo: agentevol``; docs/algorithms/agentevol.md): its settings and their
checks (``settings.py``, light: the config reads them) and the regime the trainer runs
(``regime.py``)."""
