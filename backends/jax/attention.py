"""ODEFunc as a staged self-attention in JAX: the spec's SelfAttention (ode_ref/attention.py) over
jax.numpy, with the stages that differ in JAX overridden.

The staged API JAX users know: project (fused qkv -> q, k, v in [batch, seq, heads, head_dim]),
preprocess_qkv(q, k, v, t=, positions=), build_mask(seq_len, padding_mask) with boolean masks
(True = visible), attn(q, k, v, mask), postprocess_attn(y, padding_mask), output_proj(w, y).
Subclass and override a stage to make a variant. The stage order, prepare and every stage written
against self.xp are the spec's own; this class overrides only what JAX does otherwise: the
straight-through BitLinear and the norms' and the softmax's stop_gradient (differentiation), float64 tables
gathered at run time (x64 off), functional cache writes at a traced slot, a tiled attn, and the
non-finite keys' product form. Everything is a pure function of its arrays, so jit, vmap and grad
go through; instances are static arguments under jit, hashed by their configuration.
"""

from __future__ import annotations

import copy

import jax.numpy as jnp
from jax import lax

from ode_ref import attention as spec
from ode_ref.attention import masked_fill_min
from ode_ref.tableaus import TABLEAUS

from .bitlinear import bitlinear, linear, quantize_weight
from .norms import apply_norm
from .positions import bam_bias, gather, hope_tables, rope_cos_sin, ssmax_factor
from .rk import integrate


# attn computes the scores a tile of heads at a time once they pass this many bytes: a tile is
# every batch entry for as many heads as fit (one head at least), and only the heads axis is looped
# over, so an array split by batch rows over devices (sharding.shard_batch) is never gathered.
# 4 MiB is one head of the large bench shape (B8 T512 D512 H8), the fastest of the tiles tried
# there: the block runs 1.31x as fast as untiled (benchmarks/jax_tiles.py). The conformance cases
# are all untiled.
SCORE_TILE_BYTES = 4 * 2**20


def symbolic(*shapes) -> bool:
    """Whether a shape holds a symbolic dimension (jax.export's): a size known only when the
    exported program runs."""
    return not all(isinstance(d, int) for shape in shapes for d in shape)


def tiled(fn, q, k, v, mask, bias, tile_bytes: int = SCORE_TILE_BYTES):
    """fn(q, k, v, mask, bias) -> like q, computed over tiles of heads whose scores fit tile_bytes.

    q (batch, heads, seq_q, head_dim), k, v (batch, heads, seq_k, head_dim); mask and bias None or
    broadcast against (batch, heads, seq_q, seq_k). fn must broadcast: a tile calls it with one
    head, (batch, 1, seq, head_dim), and the mask and bias of that head (those with one entry per
    head on axis 1) or whole (the others). Each head's scores, softmax and values are the same
    formulas on the same numbers as untiled, and equal up to XLA's summation order, which may
    differ with the operands' shapes. Scores within one tile: fn once, untiled."""
    batch, heads, seq_q, _ = q.shape
    if symbolic(q.shape, k.shape):  # jax.export's symbolic batch or sequence: no size to tile by, so one tile
        return fn(q, k, v, mask, bias)
    per_head = batch * seq_q * k.shape[-2] * q.dtype.itemsize
    if heads * per_head <= tile_bytes:
        return fn(q, k, v, mask, bias)

    def head_first(a):  # a's head axis first where a has one entry per head there; else None
        return jnp.moveaxis(a, 1, 0) if a is not None and a.ndim == 4 and a.shape[1] == heads else None

    def one_head(q, k, v, mask_h, bias_h):  # q, k, v (batch, seq, head_dim); mask_h, bias_h (batch | 1, ...)
        mask_h, bias_h = (whole if h is None else h[:, None] for whole, h in ((mask, mask_h), (bias, bias_h)))
        return fn(q[:, None], k[:, None], v[:, None], mask_h, bias_h)[:, 0]

    heads_first = [head_first(a) for a in (q, k, v, mask, bias)]
    y = lax.map(lambda xs: one_head(*xs), heads_first, batch_size=max(1, tile_bytes // per_head))
    return jnp.moveaxis(y, 0, 1)


def softmax(s, axis=-1):
    """The spec's softmax, its max held constant under differentiation as jax.nn.softmax holds it (the
    shift's exact gradient is 0). Differentiated, the max's gradient finds the max by equality with s
    computed again in another fusion; at LLVM's level 0 none matched and the gradient was NaN."""
    e = jnp.exp(s - lax.stop_gradient(s.max(axis=axis, keepdims=True)))
    return e / e.sum(axis=axis, keepdims=True)


def scaled_attention(q, k, v, mask, bias, scale):
    """softmax(q k^T * scale + bias, masked where mask is False) v: q (..., seq_q, head_dim), k, v
    (..., seq_k, head_dim), mask and bias None or broadcast against (..., seq_q, seq_k)."""
    s = (q @ jnp.swapaxes(k, -1, -2)) * scale
    if bias is not None:
        s = s + bias
    return softmax(s if mask is None else masked_fill_min(s, mask, jnp)) @ v


class SelfAttention(spec.SelfAttention):
    """The staged ODE function. Override a stage to make a variant; keep the signatures. The spec's
    SelfAttention over jax.numpy; each override here says why JAX differs.

    Instances are static arguments under jit, so they hash and compare by their class and their
    attributes (the config and a variant's settings): equal variants share one compilation. A
    variant with an unhashable setting (a list, an array) hashes by identity instead."""

    xp = jnp

    def _key(self):
        """(class, settings) when every setting is hashable; else (class, identity): a variant
        holding a list or an array then compiles once per instance, as any object would."""
        items = tuple(sorted(vars(self).items()))
        try:
            hash(items)
        except TypeError:
            return (type(self), id(self))
        return (type(self), items)

    def __eq__(self, other):
        return isinstance(other, SelfAttention) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    # ---- differentiation: the straight-through BitLinear, the norms' stop_gradient (softmax: above)
    quantize_weight = staticmethod(quantize_weight)

    def norm(self, norm_params: dict, z):
        return apply_norm(self.config.norm_type, norm_params, z)

    def _linear(self, x, w):
        return bitlinear(x, w) if self.config.use_bitnet else linear(x, w)

    # ---- float64 at run time: gathered from the spec's tables, or the state's dtype -----------
    # The rotary or hope tables as a program's data (block.py's shared programs: made on the host
    # from the call's config, so the program holds no table of its own); None: made here, from
    # the config, as constants of the program.
    tables = None

    def with_tables(self, tables):
        """A copy of this attention reading the rotary or hope tables given, (bound + 1, P) each
        (positions.rotary_table, hope_table), in place of its config's."""
        out = copy.copy(self)
        out.tables = tables
        return out

    def rope_tables(self, positions, bound: int, like):
        if self.tables is not None:
            return gather(self.tables, positions)
        return rope_cos_sin(positions, self.config, like.dtype, self.table_bound(bound))

    def hope_tables(self, positions, bound: int, like, layer_idx: int):
        if self.tables is not None:
            return gather(self.tables, positions)
        return hope_tables(positions, self.config, layer_idx, like.dtype, self.table_bound(bound))

    position_bound = None  # the tables' length where the sequence is symbolic; with_position_bound sets it

    def with_position_bound(self, bound: int):
        """A copy of this attention whose RoPE and HoPE tables hold the positions below bound where
        the sequence is symbolic (jax.export): the tables are the spec's float64 ones, made when the
        program is traced, so their length must be known then. The caller keeps every sequence
        within bound (export/jax_program.py declares it as the shape constraint seq <= bound)."""
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise ValueError(f"bound: expected an integer >= 1 (the most positions a sequence holds); got {bound!r}")
        out = copy.copy(self)
        out.position_bound = bound
        return out

    def table_bound(self, bound):
        """bound where it is a number; under a symbolic sequence, position_bound, or ValueError."""
        if not symbolic((bound,)):
            return bound
        if self.position_bound is None:
            raise ValueError(f"positional_encoding: {self.config.position_encoding} tabulates its angles per position, and "
                             "this sequence's length is symbolic; expected an attention with a bound on the positions "
                             "(SelfAttention(config).with_position_bound(n)); got none")
        return self.position_bound

    def bam_bias(self, encoder, positions_q, positions_k, like):
        return bam_bias(encoder, positions_q, positions_k, self.config, like.dtype)

    def ssmax_factor(self, encoder, positions_q, positions_k, seq_len: int, like):
        lengths = spec.ssmax_lengths(positions_q, positions_k, self.config, seq_len, xp=jnp)
        return ssmax_factor(encoder["ssmax.s"], lengths, like.dtype)

    # ---- the cache's slots: functional writes at a slot index that may be traced -------------
    def pad_slots(self, a, max_len: int):
        return jnp.pad(a, [(0, 0), (0, max_len - a.shape[1])] + [(0, 0)] * (a.ndim - 2))

    def write_slot(self, buffer, new, index):
        return lax.dynamic_update_slice_in_dim(buffer, new, index, axis=1)

    def read_slot(self, a, index):
        return lax.dynamic_slice_in_dim(a, index, 1, axis=1)

    def mark_slot(self, padding_mask, index):
        return self.write_slot(padding_mask, jnp.ones((padding_mask.shape[0], 1), dtype=bool), index)

    def integrate(self, prepared, x, kv=None, *, checkpoint=None, trajectory: bool = True) -> list:
        """The spec's; a prefill's (a cache hook with no past) is a scan over the evaluations
        (rk.integrate) whose outputs are each evaluation's K and V, so its program holds one
        evaluation of f, not steps x stages of them: written out, a prefill compiled 3 to 4 times as
        long as the block. A decode step keeps them written out, each evaluation writing its own
        slot array: a scan would take the slots stacked, and stacking and splitting the whole cache
        every token made the step 3x as slow at a context of 2048 (odeattn bench --decode)."""
        cfg = self.config
        if kv is None or kv.past is not None or checkpoint is not None or cfg.ode_solver not in TABLEAUS:
            return super().integrate(prepared, x, kv, checkpoint=checkpoint, trajectory=trajectory)  # a multistep one's too

        def f(t, z):
            new = []
            z = self.evaluate(prepared, t, z, lambda k, v: new.append((k, v)) or (k, v))
            return z, new[0]

        states, (k, v) = integrate(f, x, TABLEAUS[cfg.ode_solver], cfg.ode_steps, self.solution_gate(prepared),
                                   trajectory=trajectory)
        kv.k, kv.v = (list(a.reshape(-1, *a.shape[2:])) for a in (k, v))  # evaluation order: step-major
        return states

    # ---- every evaluation of f: the non-finite keys and the tiled attention -------------------
    def hide_nonfinite(self, k, v, mask):
        """The spec's stage. The queries that see a bad key: the product of the visible keys with the
        bad ones, (batch | 1, seq_q, seq_k) @ (batch, seq_k, heads), in float32 (a count > 0), so
        no (seq_q, seq_k, heads) array is made."""
        finite_k, finite_v = jnp.isfinite(k), jnp.isfinite(v)
        bad = ~(finite_k.all(axis=-1) & finite_v.all(axis=-1))  # (batch, seq_k, heads)
        zero = jnp.zeros((), k.dtype)
        counts = mask[:, 0].astype(jnp.float32) @ bad.astype(jnp.float32)  # (batch, seq_q, heads)
        return jnp.where(finite_k, k, zero), jnp.where(finite_v, v, zero), (counts > 0)[..., None]

    score_tile_bytes = SCORE_TILE_BYTES  # attn's tile size (tiled); with_tiles sets another

    def with_tiles(self, tile_bytes: int):
        """A copy of this attention (a variant's settings kept) whose attn computes the scores in
        tiles of at most tile_bytes: an instance setting, so part of its jit key."""
        out = copy.copy(self)
        out.score_tile_bytes = tile_bytes
        return out

    def attn(self, q, k, v, mask, bias=None):
        """q (batch, seq_q, heads, head_dim), k, v (batch, seq_k, ...), mask (batch | 1, 1, seq_q,
        seq_k), bias None or (batch | 1, heads, seq_q, seq_k) -> like q. The scores are computed a
        tile of heads at a time (tiled, SCORE_TILE_BYTES)."""
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        scale = jnp.asarray(self.config.scale, q.dtype)
        y = tiled(lambda *a: scaled_attention(*a, scale), q, k, v, mask, bias, self.score_tile_bytes)
        return y.transpose(0, 2, 1, 3)  # (batch, seq, heads, head_dim)
