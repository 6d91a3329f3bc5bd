"""The block as a serialized jax.export program (StableHLO), for JAX serving: batch and sequence
symbolic, the parameters inside, run by jax alone (no odeattn, no ode_ref).

    export_jax_block(config, params, *, dtype="float32", padding_mask=True, max_positions=None,
                     platforms=("cpu",)) -> bytes
    jax_runner(blob) -> run(x, padding_mask=None) -> z(1), through jax.export.deserialize(blob).call
    run_jax_block(blob, x, padding_mask=None) -> z(1), a one-shot

The program takes x (batch, seq, d_model) of dtype and, unless padding_mask=False, padding_mask
bool (batch, seq), and returns z(1) in x's dtype. RoPE, sinusoidal_rotary and HoPE gather their
angles from the spec's float64 tables, made when the program is traced, so a program with one
of them holds max_positions positions (required) and declares seq <= max_positions as a shape
constraint, which jax checks at every call; the other encodings take any length. The port's
memory check and its tiling of the scores over heads read the sizes, so under a symbolic
sequence the program holds every head's scores at once: batch x heads x seq^2 values of dtype
(docs/deployment.md). float64 programs need jax's x64 mode where they are exported and run.
platforms: the backends the program is lowered for (jax.export's multi-platform lowering; a
program runs only on one of them), CPU by default, from any machine: no GPU is needed to lower for
"cuda".
"""

from __future__ import annotations

import numbers

import numpy as np

import ode_ref as R
from ode_ref.config import ROTARY_ENCODINGS

from . import PastBounds, artifact_inputs

DTYPES = ("float32", "float64")
PLATFORMS = ("cpu", "cuda", "rocm", "tpu")  # jax.export's lowering platforms
TABULATED = (*ROTARY_ENCODINGS, "hope")  # the encodings whose angles the port gathers from a table


def export_jax_block(config, params, *, dtype: str = "float32", padding_mask: bool = True,
                     max_positions=None, platforms=("cpu",)) -> bytes:
    """The block of config and params as jax.export's serialized program (see the module
    docstring); ValueError naming the argument for a dtype, a max_positions or parameters it
    cannot take."""
    cfg = R.ODEConfig.from_any(config)
    R.params.check_params(params, cfg)
    check_export_arguments(cfg, dtype, max_positions, platforms)
    import jax
    import jax.numpy as jnp
    from jax import export

    from odeattn.backends.jax import ode_block
    from odeattn.backends.jax.attention import SelfAttention

    tabulated = cfg.position_encoding in TABULATED
    attention = SelfAttention(cfg).with_position_bound(int(max_positions)) if tabulated else SelfAttention(cfg)
    with jax.enable_x64(dtype == "float64"):
        weights = {k: jnp.asarray(np.asarray(v, dtype)) for k, v in params.items()}
        batch, seq = export.symbolic_shape("batch, seq", constraints=[f"seq <= {int(max_positions)}"] if tabulated else ())
        x = jax.ShapeDtypeStruct((batch, seq, cfg.hidden_size), np.dtype(dtype))
        if padding_mask:
            program = jax.jit(lambda x, mask: ode_block(weights, x, cfg, mask, attention=attention))
            exported = export.export(program, platforms=tuple(platforms))(x, jax.ShapeDtypeStruct((batch, seq), np.bool_))
        else:
            program = jax.jit(lambda x: ode_block(weights, x, cfg, attention=attention))
            exported = export.export(program, platforms=tuple(platforms))(x)
        return bytes(exported.serialize())


def check_export_arguments(config, dtype: str, max_positions, platforms=("cpu",)) -> None:
    """ValueError naming dtype, max_positions or platforms where export_jax_block cannot take them
    (no jax imported: a command checks them before any work)."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype: expected one of {', '.join(DTYPES)} (jax.export's program computes in it); got {dtype!r}")
    if (isinstance(platforms, str) or not platforms or any(p not in PLATFORMS for p in platforms)
            or len(set(platforms)) != len(platforms)):
        got = repr(platforms) if isinstance(platforms, str) else ", ".join(map(str, platforms)) or "none"
        raise ValueError(f"platforms: expected one or more of {', '.join(PLATFORMS)}, each once; got {got}")
    encoding = config.position_encoding
    if encoding in TABULATED and (isinstance(max_positions, bool) or not isinstance(max_positions, numbers.Integral)
                                  or max_positions < 1):
        raise ValueError(f"max_positions: {encoding} gathers its angles from a table made when the program is traced; "
                         f"expected the most positions a sequence holds, an integer >= 1; got "
                         f"{'none' if max_positions is None else repr(max_positions)}")
    if encoding not in TABULATED and max_positions is not None:
        effect = f"{encoding} (ode_use_pe is off)" if not config.ode_use_pe else encoding
        raise ValueError(f"max_positions: only {', '.join(TABULATED)} take a bound on the positions; got {max_positions!r} "
                         f"for {effect}")


class JaxRunner:
    """A serialized program (export_jax_block) deserialized once and called, as a server keeps it:
    run(x, padding_mask=None) -> z(1) as NumPy. dtype, d_model and takes_mask are read off the
    program. It stores no config and, once deserialized, no bound on the positions: jax checks a
    declared seq <= max_positions, the program's one shape constraint, at each call, and a
    longer sequence is refused (export.PastBounds, from jax's "Error refining shapes"). x is
    cast to the program's dtype; no mask: every token real. A program exported without the mask
    input refuses a mask that pads a token (ValueError), rather than reading padding as tokens. ValueError for bytes that are no serialized program."""

    kind = "program"

    def __init__(self, blob: bytes):
        import jax
        from jax import export

        try:
            self.program = export.deserialize(bytearray(blob))
        except Exception as err:  # jax's flatbuffer reader raises its own kinds on other bytes
            raise ValueError(f"program: expected a serialized jax.export program; reading it failed "
                             f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no message'})") from None
        avals = self.program.in_avals
        self.dtype, self.d_model, self.takes_mask = np.dtype(avals[0].dtype).name, avals[0].shape[2], len(avals) == 2
        self._x64 = jax.enable_x64

    def __call__(self, x, padding_mask=None):
        x, mask = artifact_inputs(np.asarray(x), padding_mask, d_model=self.d_model, dtype=np.dtype(self.dtype),
                                  takes_mask=self.takes_mask, what="program")
        try:
            with self._x64(self.dtype == "float64"):
                return np.asarray(self.program.call(x) if mask is None else self.program.call(x, mask))
        except ValueError as err:
            if str(err).startswith("Error refining shapes"):
                raise PastBounds(f"x: seq {x.shape[1]}; the program holds at most the positions it was exported "
                                 "with (--max-positions)") from None
            raise


def jax_runner(blob: bytes) -> JaxRunner:
    """The program deserialized once, to be called as run(x, padding_mask=None) -> z(1) (JaxRunner)."""
    return JaxRunner(blob)


def run_jax_block(blob: bytes, x, padding_mask=None) -> np.ndarray:
    """z(1) of a serialized program on x, through jax alone, in the program's dtype (a one-shot: a
    server keeps jax_runner's run)."""
    return JaxRunner(blob)(x, padding_mask)
