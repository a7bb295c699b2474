"""Our envs and algorithms on TRL's ``GRPOTrainer`` (``agentgym train --engine trl``):
episodes as its ``rollout_func`` (``episodes.py``), our update inside its loop
(``grpo.py``), configs checked and translated (``build.py``), our run folder written from
its callbacks (``run.py``). See docs/trl.md."""
