"""Running the cases: the runner, its worker processes and their frames, the profile."""
