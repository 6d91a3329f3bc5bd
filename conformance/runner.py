"""odeattn.conformance.runner, kept for its importers: the module is odeattn.conformance.running.runner."""

from .running.runner import *  # noqa: F403
