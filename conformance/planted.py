"""odeattn.conformance.planted, kept for its importers: the module is odeattn.conformance.mutation.planted."""

from .mutation.planted import *  # noqa: F403
