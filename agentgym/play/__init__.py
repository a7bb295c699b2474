"""How a policy plays: one episode's turn loop (``episode``), many at once (``rollout``), a
split evaluated (``evaluation``), how a trained run is played (``play_profile``), and a critic in
the loop (``critique``, ``critic_eval``)."""
