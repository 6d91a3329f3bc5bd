"""odeattn: the ports (odeattn.backends: torch, jax, flax), the conformance suite (odeattn.conformance),
the ONNX export (odeattn.export), the command line (odeattn.cli) and benchmarks (odeattn.bench).
The spec is the top-level package ode_ref. In the repository, backends/, conformance/ and
export/ stay at the top and are installed into this namespace (pyproject.toml's package-dir)."""

from ode_ref import __version__ as __version__
