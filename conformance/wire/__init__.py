"""The wire: what the suite's processes send one another and how they outlive one another (frames,
lifetimes, the exit words), and the compilation counters a worker reports with each reply. The
lowest of the suite's own layers after cases/: the adapters build on it, the runner above them."""
