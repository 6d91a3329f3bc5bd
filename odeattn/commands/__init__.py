"""The command layer: one module per `odeattn` subcommand, each a thin parser over library calls.

Nothing below this package (ode_ref, odeattn.backends, odeattn.conformance, odeattn.export,
odeattn.bench) imports it.
"""
