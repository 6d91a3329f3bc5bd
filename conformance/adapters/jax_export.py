"""jax.export's serialized program (export/jax_program.py) as a backend: each case's block
exported with symbolic batch and sequence, serialized, then deserialized and called through jax
alone, as a deployer's JAX server runs it. The program returns z(1) only, so a block case is
judged at z1; it has no cached decoding, backward pass, encoder or language model."""

from __future__ import annotations

from .jax import jax_with_cache
from .protocol import NotSupported

# The bound the suite's RoPE, sinusoidal_rotary and HoPE programs declare on the sequence: above
# every golden case's (513) and the fuzzer's longest draws.
MAX_POSITIONS = 1024


class JaxExportAdapter:
    name = "jax-export"
    dtypes = ("float32", "float64")
    flushes_subnormals = True  # XLA on CPU, as the jax row (cases/tolerance.py)

    def __init__(self):
        jax_with_cache()

    def supports(self, config, dtype):
        return None

    def run_block(self, config, params, x, padding_mask, dtype):
        from odeattn.export.jax_program import TABULATED, export_jax_block, run_jax_block

        bound = MAX_POSITIONS if config.position_encoding in TABULATED else None
        if bound is not None and x.shape[1] > bound:
            raise NotSupported(f"not supported: {config.position_encoding} over {x.shape[1]} tokens; the suite's programs "
                               f"hold {bound} positions (max_positions)")
        blob = export_jax_block(config, params, dtype=dtype, padding_mask=padding_mask is not None, max_positions=bound)
        return run_jax_block(blob, x, padding_mask)
