"""odeattn.conformance.mutants, kept for its importers: the module is odeattn.conformance.mutation.mutants."""

from .mutation.mutants import *  # noqa: F403
