"""Training: algorithms as pure functions, schedules, the trainer loop (issue 4)."""
