"""odeattn.conformance.tolerance, kept for its importers: the module is odeattn.conformance.cases.tolerance."""

from .cases.tolerance import *  # noqa: F403
