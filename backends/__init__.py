"""Ports of the spec: odeattn.backends.torch (PyTorch), odeattn.backends.jax (JAX) and odeattn.backends.flax
(flax.linen Modules over the JAX port). Each mirrors ode_ref's file, function and stage names so that a spec
function and its port read side by side."""
