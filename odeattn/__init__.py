"""odeattn: the command line (odeattn.cli) and benchmarks (odeattn.bench) over the packages
ode_ref (the spec), backends (torch, jax), conformance and export."""

from ode_ref import __version__ as __version__
