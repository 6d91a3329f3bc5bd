"""Ports of the spec: odeattn.backends.torch (PyTorch) and odeattn.backends.jax (JAX). Each mirrors ode_ref's
file, function and stage names so that a spec function and its port read side by side."""
