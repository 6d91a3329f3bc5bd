"""JAX port of ode_ref: pure functions over a dict pytree of parameters with the spec's names.
Importing it changes no global JAX setting (x64 stays as the user set it).

What compiles again. `ode_block_jit` called on concrete arrays (NumPy or jax.Array, not inside
your own jit, grad or vmap) with the port's own SelfAttention keys its program by the config's
structure and takes the rest as data, so changing these runs the program already compiled:

- `ode_steps` (unless the trajectory is returned: its length is part of its shape; or the solver
  is gated, `rk2_gated`, whose solution is written with the step size; or a multistep one,
  `ab2`, `ab3`, `momentum`, whose start is written out and whose solver and steps stay static);
- `ode_solver` for another tableau with as many stages (`euler`; `midpoint`, `heun`, `ralston`;
  `rk4`, `rk38`);
- the rotary and hope tables' fields: `rope_base`, `rope_scaling`, `sinusoidal_base`,
  `sinusoidal_scale`, `hope_base`, `hope_damping` (not for a float16 or bfloat16 input: the
  half-precision policy checks hope's range against them when the program is traced).

Everything else compiles a program of its own: the shapes and dtypes of the inputs, whether a
padding mask is given, the stage count, and every other field (the norm, the encoding and its
other options, BitLinear, the mode, the heads). So do `ode_block` under a jax.jit of your own, a
variant (`attention=`, which may read any field), `checkpoint=True`, `prefill` and
`decode_step`: there the whole config is static. The values are the same either way: the data are
the numbers the traced program held as constants (tests/backends/jax/test_block.py counts the
compilations). Only z(1) with the step count as data runs its steps in a loop whose trip count is
an argument, which XLA compiles otherwise than a fixed-length one: on 11 of the golden set's 113
block cases z(1) differs from the fixed-length program's in its last bits, in float32 and float64
(in float32 by at most 0.81 of the spec's own float32 error for the case), and on none in bfloat16."""

from .attention import SelfAttention as SelfAttention
from .block import decode_step as decode_step, ode_block as ode_block, ode_block_jit as ode_block_jit
from .encoder import ode_encoder as ode_encoder
from .block import ode_func as ode_func, prefill as prefill
from ode_ref.variants import port_variants as _port_variants

globals().update(_port_variants(SelfAttention, __name__))  # the spec's example variants, ported, by name
