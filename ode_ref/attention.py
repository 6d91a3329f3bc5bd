"""ODEFunc as a staged self-attention, f(t, z) for z: (batch, seq, d_model).

    prepare          once per block: cast parameters, quantise BitLinear weights, build the mask,
                     the positions and their encodings (rotary or hope tables, ALiBi or BAM bias,
                     SSMax's factor; positions.py)
    hide_padding     padded tokens read as 0 (their bits never reach a real token)
    norm             h = norm(z)                                   (batch, seq, d_model)
    project          q, k, v = split(h @ Wqkv^T)                   (batch, seq, heads, head_dim) each
    preprocess_qkv   rope, sinusoidal_rotary or hope on q, k when configured; a variant may scale
                     or rotate (gets t, positions)
    (kv hook)        decoding: this token's k, v written to the cache, every slot read (cache.py)
    hide_nonfinite   k, v with each NaN or Inf read as 0; poison: the queries that see a key whose
                     k or v (in that head) held one                (batch, seq_q, heads, 1)
    content_bias     PaPE only: the score term of the query's state z (hidden padding, before the
                     norm) and the positions, every evaluation     (batch, heads, seq_q, seq_k)
    ssmax_queries    SSMax only: q times s_h ln(n_i) (every bias was multiplied too: ssmax_bias)
    poison_queries   q = NaN for a poisoned query (its attention output is then NaN)
    attn             softmax((q @ k^T) * scale + bias where mask else -big, over keys) @ v
    postprocess_attn zero the output of padded queries
    merge_heads      (batch, seq, heads, head_dim) -> (batch, seq, d_model)
    output_proj      y @ Wout^T
    gate             the gated solver only (rk2_gated), once per step: g = sigmoid([F1; F2] @ Wg^T + bg)

The order (Stages below) is written once and run by every port; a port writes the stages.
A variant subclasses SelfAttention and overrides one stage (see variants.py); ode_block integrates
any variant. Masks are boolean, True = visible. A masked score is replaced by the dtype's most
negative finite value, not -inf, so a fully masked row (a padded query under the causal mask)
gives a uniform row instead of NaN; postprocess_attn then zeroes it.

Non-finite values: a query that attends to a non-finite key or value gets NaN; others never read
it, bit for bit. A hidden key's weight is exactly 0, but 0 * NaN is NaN in `a @ v` (and NaN + the
mask's -big in a fused kernel's scores), so hide_nonfinite replaces each NaN or Inf in k and v by
0 with a select before attn (a hidden key then adds exact zeros), and poison_queries puts the NaN
back into each query (and head) that sees such a key under the evaluation's mask, as a NaN query,
whose scores, weights and output every attention kernel makes NaN in its own row: nothing falls
back silently. (The select is on q, not on attn's output, because there it leaves XLA's fusion of
the ops after attn as it was: the finite results keep their bits.) Everything else in f is per
token (the padded ones already read as 0).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .bitlinear import bitlinear, linear, quantize_weight
from .cache import CacheSlots, KVCache
from .config import PAPE_ENCODINGS, ROTARY_ENCODINGS, ODEConfig
from .norms import NORM_PARAMS, apply_norm
from .params import GATE_BIAS, GATE_WEIGHT, NORM_PREFIX, OUT_PROJ, POS_PREFIX, QKV, encoder_shapes
from .positions import alibi_bias, apply_hope, apply_rope, bam_bias, content_bias, hope_tables, rope_cos_sin
from .positions import ssmax_bias, ssmax_factor, ssmax_lengths, ssmax_queries
from .multistep import solve, solver, solver_of


def softmax(s, axis=-1, xp=np):
    """exp(s - max) / sum, stable for any finite s (the max subtraction keeps exp <= 1)."""
    e = xp.exp(s - s.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def sigmoid(x, xp=np):
    """1 / (1 + exp(-x)), as exp(-log(1 + exp(-x))): no overflow for any finite x."""
    return xp.exp(-xp.logaddexp(xp.asarray(0, dtype=x.dtype), -x))


def causal_mask(seq_len: int, xp=np):
    """(seq, seq) bool, True where key j <= query i."""
    return xp.tril(xp.ones((seq_len, seq_len), dtype=bool))


def slot_indices(seq_len: int, cache_index=None, xp=np):
    """(query indices (seq_q, 1), key indices (seq,)): every token queries, or, decoding, the one
    token at slot cache_index of a cache of seq_len slots (cache_index may be an array)."""
    j = xp.arange(seq_len)
    return (j[:, None] if cache_index is None else xp.reshape(xp.asarray(cache_index), (1, 1))), j


def positions_from_padding(padding_mask, seq_len: int, xp=np):
    """(batch | 1, seq) int positions: cumsum(mask) - 1, or 0 .. seq-1 without a mask."""
    if padding_mask is None:
        return xp.arange(seq_len)[None, :]
    return xp.cumsum(padding_mask, axis=-1) - 1


def masked_fill_min(s, mask, xp=np):
    """s where mask is True, else the dtype's most negative finite value."""
    return xp.where(mask, s, xp.finfo(s.dtype).min)


class Prepared(NamedTuple):
    """What every evaluation of f shares within one block forward (computed once by prepare).
    Shapes are the spec's; each port holds the same fields in its own arrays. seq_q is seq, or 1
    when decoding; seq_k is seq, or the cache's max_len."""

    qkv: Any  # (3 d_model, d_model), BitLinear-quantised when use_bitnet
    out_proj: Any  # (d_model, d_model), likewise
    norm: dict  # norm parameters by short name, in the state's dtype
    mask: Any  # bool (batch | 1, 1, seq_q, seq_k), True = visible (a port's own form: merge_bias)
    bias: Any  # ALiBi or BAM score bias (batch | 1, heads, seq_q, seq_k) in the state's dtype
    # (times SSMax's factor when on); or None
    padding_mask: Any  # bool (batch, seq_q), True = real token; or None (decoding: the token is real)
    positions: Any  # int (batch | 1, seq_q)
    rope: Any = None  # rotary (cos, sin) or hope (r cosh, r sinh), each (batch | 1, seq_q, head_dim // 2)
    # in the state's dtype; or None
    gate: Any = None  # the gated solver's (W_g (1, 2 d_model), b_g (1,)) in the state's dtype; or None
    key_positions: Any = None  # int (batch | 1, seq_k): the keys' positions (content_bias reads them)
    encoder: Any = None  # the encoder's parameters by short name in the state's dtype; or None (it has none)
    ssmax: Any = None  # SSMax's factor s_h ln(n_i), (batch | 1, heads, seq_q, 1) in the state's dtype; or None


class Stages:
    """The orchestration of f: what a block forward prepares once, the stage order of every
    evaluation, and cached decoding. Written once, here, and mixed into every port's SelfAttention
    (this spec, PyTorch, JAX and the ONNX export), each of which supplies the stages in its own
    arrays, plus hooks: weights (the parameters in the state's dtype), seq_len, merge_heads,
    hide_nonfinite and poison_queries (the non-finite keys and values, in the port's mask form), and
    for the cache pad_slots, write_slot, read_slot, mark_slot and all_real."""

    def prepare(self, params, x, padding_mask=None, layer_idx=None) -> Prepared:
        """The whole sequence x (batch, seq, d_model) at once. layer_idx: hope's, for this forward
        (the seed's logical_layer_idx); None: the config's."""
        seq_len = self.seq_len(x)
        positions = self.positions_from_padding(padding_mask, seq_len)
        return self.prepare_with(params, x, self.build_mask(seq_len, padding_mask), padding_mask,
                              positions, positions, seq_len, layer_idx)

    def prepare_decode(self, params, x_t, cache: KVCache) -> Prepared:
        """One new real token x_t (batch, 1, d_model) at slot cache.index; its keys are every slot
        (those not yet written, or padded, are masked). Its position: the real tokens before it."""
        max_len = self.seq_len(cache.padding_mask)
        keys = self.mark_slot(cache.padding_mask, cache.index)
        key_positions = self.positions_from_padding(keys, max_len)
        positions = self.read_slot(key_positions, cache.index)
        mask = self.build_mask(max_len, keys, cache_index=cache.index)
        return self.prepare_with(params, x_t, mask, None, positions, key_positions, max_len)

    def prepare_with(self, params, x, mask, padding_mask, positions, key_positions, bound, layer_idx=None) -> Prepared:
        """What prepare and prepare_decode share, from a mask and positions already built (a model
        that computes them from its own inputs passes its own: export/genai.py). bound: every
        position is < bound (a port that tabulates RoPE needs it); it is also the sequence's
        (padded) length, SSMax's n under the seed's rule."""
        cfg = self.config
        qkv, out_proj, norm = self.weights(params, x)
        if cfg.use_bitnet:
            qkv, out_proj = self.quantize_weight(qkv), self.quantize_weight(out_proj)
        encoding = cfg.position_encoding
        encoder = self.encoder_weights(params, x) if encoder_shapes(cfg) else None
        rope = (self.rope_tables(positions, bound, x) if encoding in ROTARY_ENCODINGS else
                self.hope_tables(positions, bound, x, cfg.layer_idx if layer_idx is None else layer_idx)
                if encoding == "hope" else None)
        bias = (self.alibi_bias(positions, key_positions, x) if encoding == "alibi" else
                self.bam_bias(encoder, positions, key_positions, x) if encoding == "bam" else None)
        factor = self.ssmax_factor(encoder, positions, key_positions, bound, x) if cfg.ssmax else None
        if factor is not None and bias is not None:
            bias = self.ssmax_bias(bias, factor)
        gate = self.gate_weights(params, x) if solver(cfg.ode_solver).gated else None
        return Prepared(qkv, out_proj, norm, *self.merge_bias(mask, bias), padding_mask, positions, rope, gate,
                        key_positions, encoder, factor)

    def merge_bias(self, mask, bias):
        """(mask, bias) as attn takes them: here, as built. A port whose attention kernel takes one
        additive mask merges them here, once per forward, not at every evaluation."""
        return mask, bias

    def hide_keys(self, mask, visible):
        """mask & visible: a variant's build_mask narrowing the mask; visible is bool, broadcast
        against (batch | 1, 1, seq_q, seq_k). A port whose mask is None (every key visible) gets visible."""
        return visible if mask is None else mask & visible

    def evaluate(self, prepared: Prepared, t, z, kv=None):
        """f(t, z): (batch, seq, d_model) -> (batch, seq, d_model). kv: a CacheSlots, or None."""
        z = self.hide_padding(z, prepared.padding_mask)
        h = self.norm(prepared.norm, z)
        q, k, v = self.project(prepared.qkv, h)
        q, k, v = self.preprocess_qkv(q, k, v, t=t, positions=prepared.positions, rope=prepared.rope)
        if kv is not None:
            k, v = kv(k, v)
        k, v, poison = self.hide_nonfinite(k, v, prepared.mask)
        mask, bias = prepared.mask, prepared.bias
        if self.config.position_encoding in PAPE_ENCODINGS:  # of the raw state z, not the normed h
            bias = self.content_bias(prepared.encoder, z, prepared.positions, prepared.key_positions)
            mask, bias = self.merge_bias(mask, bias if prepared.ssmax is None else self.ssmax_bias(bias, prepared.ssmax))
        if prepared.ssmax is not None:
            q = self.ssmax_queries(q, prepared.ssmax)
        y = self.attn(self.poison_queries(q, poison), k, v, mask, bias)
        y = self.postprocess_attn(y, prepared.padding_mask)
        return self.output_proj(prepared.out_proj, self.merge_heads(y))

    def solution_gate(self, prepared: Prepared):
        """The gated solver's g(F1, F2) over prepared's gate weights (the stage `gate`), or None."""
        if prepared.gate is None:
            return None
        return lambda f1, f2: self.gate(prepared.gate, f1, f2)

    def integrate(self, prepared: Prepared, x, kv=None, *, checkpoint=None, trajectory: bool = True) -> list:
        """The states [z(0) = x, z(1/steps), ..., z(1)] by the config's solver, or [z(1)] without
        trajectory: ode_ref.multistep.solve over evaluate (kv: the cache hook; checkpoint: a port's
        activation checkpointing, see rk.integrate and solve). prepared is computed once, outside the steps,
        so a checkpointed step never recomputes it."""
        cfg = self.config
        return solve(lambda t, z: self.evaluate(prepared, t, z, kv), x, solver_of(cfg), cfg.ode_steps,
                     self.solution_gate(prepared), checkpoint=checkpoint, trajectory=trajectory)

    def prefill(self, params, x, padding_mask, max_len: int):
        """(z(1) of the prompt x (batch, seq, d_model), a KVCache of max_len slots holding it)."""
        slots = CacheSlots(self)
        z = self.integrate(Stages.prepare(self, params, x, padding_mask), x, slots, trajectory=False)[-1]  # Stages': not a port's checking wrapper
        real = self.all_real(x) if padding_mask is None else padding_mask
        k, v = (tuple(self.pad_slots(a, max_len) for a in kv) for kv in (slots.k, slots.v))
        return z, KVCache(self.config, k, v, self.pad_slots(real, max_len), self.seq_len(x))

    def decode(self, params, x_t, cache: KVCache):
        """(z(1) of the new token x_t (batch, 1, d_model), the cache with it at slot cache.index)."""
        slots = CacheSlots(self, cache)
        z = self.integrate(self.prepare_decode(params, x_t, cache), x_t, slots, trajectory=False)[-1]
        keys = self.mark_slot(cache.padding_mask, cache.index)
        return z, KVCache(self.config, tuple(slots.k), tuple(slots.v), keys, cache.index + 1)


class SelfAttention(Stages):
    """The staged ODE function. Override a stage to make a variant; keep the signatures.

    Every stage is written against the array namespace self.xp (NumPy here) with NumPy's names,
    which jax.numpy shares and the torch port's namespace provides, so a port subclasses this
    class, sets its xp and overrides only what differs in its framework (a fused or tiled attn,
    in-place cache writes, float64 tables, parameters a module owns)."""

    xp = np  # the array namespace: jax.numpy in JAX, backends/torch/xp.py in PyTorch

    def __init__(self, config):
        self.config = ODEConfig.from_any(config)

    # ---- once per block (Stages.prepare) --------------------------------------------------
    def weights(self, params: dict, x):
        """(W_qkv, W_out, norm parameters by short name), cast to x's dtype."""
        xp, dtype = self.xp, x.dtype
        norm = {k: xp.asarray(params[NORM_PREFIX + k]).astype(dtype) for k in NORM_PARAMS[self.config.norm_type]}
        return xp.asarray(params[QKV]).astype(dtype), xp.asarray(params[OUT_PROJ]).astype(dtype), norm

    def encoder_weights(self, params: dict, x):
        """The encoder's parameters by short name ('ab.weight', 'ssmax.s', ...), cast to x's dtype."""
        return {k: self.xp.asarray(params[POS_PREFIX + k]).astype(x.dtype) for k in encoder_shapes(self.config)}

    def gate_weights(self, params: dict, x):
        """(W_g (1, 2 d_model), b_g (1,)) of the gated solver, cast to x's dtype."""
        return params[GATE_WEIGHT].astype(x.dtype), params[GATE_BIAS].astype(x.dtype)

    quantize_weight = staticmethod(quantize_weight)

    def positions_from_padding(self, padding_mask, seq_len: int):
        return positions_from_padding(padding_mask, seq_len, self.xp)

    # ---- what a variant's stages use besides operators (variants.py), in every port ---------
    # xp's sqrt, exp, log, tanh, abs, where, sum and mean run in every port, the export's too
    def slot_indices(self, seq_len: int, cache_index=None):
        return slot_indices(seq_len, cache_index, self.xp)

    def asarray(self, value, like):
        """A constant (nested lists of numbers) as an array in like's dtype."""
        return self.xp.asarray(value, dtype=like.dtype)

    def seq_len(self, x) -> int:
        return x.shape[1]

    def build_mask(self, seq_len: int, padding_mask=None, *, cache_index=None):
        """bool (batch | 1, 1, seq_q, seq_k): padded keys hidden; decoder adds the causal mask.
        Decoding (cache_index given): the one query at that slot; seq_len is the cache's."""
        i, j = self.slot_indices(seq_len, cache_index)
        mask = self.xp.ones((1, 1, i.shape[0], seq_len), dtype=bool)
        if self.config.mode == "decoder":
            mask = mask & (j <= i)
        if padding_mask is not None:
            mask = mask & padding_mask[:, None, None, :]
        return mask

    def rope_tables(self, positions, bound: int, like):
        """(cos, sin) of the positions' angles, (batch | 1, seq, P) in like's dtype (positions.py)."""
        return rope_cos_sin(positions, self.config, like.dtype)

    def alibi_bias(self, positions_q, positions_k, like):
        """(batch | 1, heads, seq_q, seq_k) in like's dtype (positions.py)."""
        return alibi_bias(positions_q, positions_k, self.config, like.dtype, xp=self.xp)

    def hope_tables(self, positions, bound: int, like, layer_idx: int):
        """hope's (r cosh, r sinh), (batch | 1, seq, P) in like's dtype (positions.py)."""
        return hope_tables(positions, self.config, layer_idx, like.dtype)

    def bam_bias(self, encoder, positions_q, positions_k, like):
        """(batch | 1, heads, seq_q, seq_k) in like's dtype (positions.py)."""
        return bam_bias(encoder, positions_q, positions_k, self.config, like.dtype)

    def ssmax_factor(self, encoder, positions_q, positions_k, seq_len: int, like):
        """(batch | 1, heads, seq_q, 1) in like's dtype: s_h ln(n_i) (positions.py)."""
        lengths = ssmax_lengths(positions_q, positions_k, self.config, seq_len, xp=self.xp)
        return ssmax_factor(encoder["ssmax.s"], lengths, like.dtype)

    # ---- the cache's slots (Stages.prefill, Stages.decode); axis 1 is the slot ----------------
    def all_real(self, x):
        """bool (batch, seq) all True: the padding mask of an unpadded prompt."""
        return self.xp.ones(x.shape[:2], dtype=bool)

    def pad_slots(self, a, max_len: int):
        """a (batch, seq, ...) zero-padded (False for bool) to (batch, max_len, ...)."""
        out = np.zeros((a.shape[0], max_len, *a.shape[2:]), dtype=a.dtype)
        out[:, :a.shape[1]] = a
        return out

    def write_slot(self, buffer, new, index):
        """A copy of buffer (batch, max_len, ...) with new (batch, 1, ...) at slot index."""
        out = buffer.copy()
        out[:, index:index + 1] = new
        return out

    def read_slot(self, a, index):
        """a[:, index:index + 1]: (batch, 1, ...)."""
        return a[:, index:index + 1]

    def mark_slot(self, padding_mask, index):
        """A copy of padding_mask (batch, max_len) with slot index True (a decoded token is real)."""
        out = padding_mask.copy()
        out[:, index] = True
        return out

    # ---- every evaluation of f (Stages.evaluate) --------------------------------------------
    def hide_padding(self, z, padding_mask=None):
        """Padded tokens read as 0: whatever bits they hold (NaN, Inf) never reach a real token.
        For finite inputs nothing changes: padded keys are never attended, padded queries zeroed."""
        if padding_mask is None:
            return z
        return self.xp.where(padding_mask[:, :, None], z, self.xp.asarray(0, dtype=z.dtype))

    def norm(self, norm_params: dict, z):
        return apply_norm(self.config.norm_type, norm_params, z)

    def _linear(self, x, w):
        return bitlinear(x, w) if self.config.use_bitnet else linear(x, w)

    def project(self, w_qkv, h):
        """h: (batch, seq, d_model) -> q, k, v each (batch, seq, heads, head_dim)."""
        b, t, _ = h.shape
        qkv = self._linear(h, w_qkv).reshape(b, t, 3, self.config.num_heads, self.config.head_dim)
        return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        """The rotation (rope, sinusoidal_rotary) or hope's map on q and k (rope: prepare's tables,
        or None). A variant may also scale or rotate; t and the integer positions (batch | 1, seq)
        are passed for that."""
        if rope is None:
            return q, k, v
        apply = apply_hope if self.config.position_encoding == "hope" else apply_rope
        return apply(q, *rope, xp=self.xp), apply(k, *rope, xp=self.xp), v

    def content_bias(self, encoder, z, positions_q, positions_k):
        """PaPE's score term (batch, heads, seq_q, seq_k) in z's dtype, of z (batch, seq_q, d_model)."""
        return content_bias(z, encoder, positions_q, positions_k, self.config, xp=self.xp)

    ssmax_bias = staticmethod(ssmax_bias)

    def ssmax_queries(self, q, factor):
        return ssmax_queries(q, factor, self.xp)

    def hide_nonfinite(self, k, v, mask):
        """(k, v, poison): k and v (batch, seq_k, heads, head_dim) with each NaN or Inf replaced by
        0, a select (for finite values nothing changes), and poison, bool (batch, seq_q, heads, 1):
        whether the query, in that head, sees under mask (batch | 1, 1, seq_q, seq_k) a key whose k
        or v held one. The ports compute the same sets their own way (a cumulative any under the
        plain causal mask, a product of the mask with the bad keys under any other)."""
        xp = self.xp
        finite_k, finite_v = xp.isfinite(k), xp.isfinite(v)
        bad = ~(finite_k.all(axis=-1) & finite_v.all(axis=-1))  # (batch, seq_k, heads)
        zero = k.dtype.type(0)
        poison = (mask[:, 0, :, :, None] & bad[:, None]).any(axis=2)  # (batch, seq_q, heads)
        return xp.where(finite_k, k, zero), xp.where(finite_v, v, zero), poison[..., None]

    def poison_queries(self, q, poison):
        """q (batch, seq_q, heads, head_dim), NaN where hide_nonfinite's poison is True: the query's
        attention output is then NaN, what it would have read."""
        return self.xp.where(poison, q.dtype.type(np.nan), q)

    def attn(self, q, k, v, mask, bias=None):
        """q (batch, seq_q, heads, head_dim), k, v (batch, seq_k, heads, head_dim), mask
        (batch | 1, 1, seq_q, seq_k), bias (ALiBi) None or (batch | 1, heads, seq_q, seq_k) -> like q.
        The bias is added before the mask fill, so a fully masked row stays finite. A query (head)
        holding NaN or Inf gets a NaN row wherever it sees a key (poison_queries relies on it; a
        port whose fused kernel returns a finite row there puts the NaN back)."""
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        s = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(self.config.scale)  # (b, h, seq_q, seq_k)
        if bias is not None:
            s = s + bias
        a = softmax(masked_fill_min(s, mask, self.xp), xp=self.xp)
        return (a @ v).transpose(0, 2, 1, 3)  # (batch, seq, heads, head_dim)

    def postprocess_attn(self, y, padding_mask=None):
        if padding_mask is None:
            return y
        return y * self.xp.astype(padding_mask[:, :, None, None], y.dtype)

    def merge_heads(self, y):
        """(batch, seq, heads, head_dim) -> (batch, seq, d_model)."""
        return y.reshape(*y.shape[:2], self.config.hidden_size)

    def output_proj(self, w_out, y):
        return self._linear(y, w_out)

    # ---- the gated solver, once per step (Stages.solution_gate) ------------------------------
    def gate(self, gate_params, f1, f2):
        """g = sigmoid([F1; F2] @ W_g^T + b_g): F1, F2 (batch, seq, d_model) -> (batch, seq, 1)."""
        w, b = gate_params
        return sigmoid(self.xp.concatenate([f1, f2], axis=-1) @ w.T + b, xp=self.xp)

    __call__ = Stages.evaluate


def of_the_spec(cls) -> bool:
    """Whether cls is the spec's SelfAttention or a variant of it, not a port's: a port's class
    subclasses the spec's and sets its own xp."""
    return isinstance(cls, type) and issubclass(cls, SelfAttention) and cls.xp is np
