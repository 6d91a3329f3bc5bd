"""Running the cases: the runner, its worker processes (their frames: wire/), the profile."""
