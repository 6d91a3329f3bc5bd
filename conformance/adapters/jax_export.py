"""jax.export's serialized program (export/jax_program.py) as a backend: each case's block
exported with symbolic batch and sequence and serialized here, then deserialized and called by jax
in the row's runtime-only worker (targets.py), as a deployer's JAX server runs it. The program
returns z(1) only, so a block case is judged at z1; it has no cached decoding, backward pass,
encoder or language model."""

from __future__ import annotations

import os

from .jax import jax_cache_dir, jax_with_cache
from .protocol import NotSupported
from .targets import BlockTarget

# The bound the suite's RoPE, sinusoidal_rotary and HoPE programs declare on the sequence: above
# every golden case's (513) and the fuzzer's longest draws.
MAX_POSITIONS = 1024


class JaxExportAdapter(BlockTarget):
    name, target = "jax-export", "jax"
    dtypes = ("float32", "float64")
    flushes_subnormals = True  # XLA on CPU, as the jax row (cases/tolerance.py)

    imports = ("flatbuffers",)  # jax after the worker has started (targets.TargetRow)

    def __init__(self):
        # the worker's jax keeps every program in the suite's persistent compilation cache, as the jax row does
        cache = {"JAX_COMPILATION_CACHE_DIR": jax_cache_dir(), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
        super().__init__(env={**os.environ, **cache})
        jax_with_cache()

    def supports(self, config, dtype):
        return None

    def run_block(self, config, params, x, padding_mask, dtype):
        from odeattn.export.jax_program import TABULATED, export_jax_block

        bound = MAX_POSITIONS if config.position_encoding in TABULATED else None
        if bound is not None and x.shape[1] > bound:
            raise NotSupported(f"not supported: {config.position_encoding} over {x.shape[1]} tokens; the suite's programs "
                               f"hold {bound} positions (max_positions)")
        blob = export_jax_block(config, params, dtype=dtype, padding_mask=padding_mask is not None, max_positions=bound)
        return self.call(blob, config, x, padding_mask, dtype)
