"""The conformance suite: golden cases from the spec, the runner, and the adapter protocol."""

from .adapters.protocol import Adapter as Adapter, OptionalMethods as OptionalMethods
