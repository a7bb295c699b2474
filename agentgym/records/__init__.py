"""What plays and runs leave behind, and the formats that read it back: the run folder
(``run_folder``), trajectories (``trajectory``, ``trajectory_table``), the curves of a run's
metrics (``curves``)."""
