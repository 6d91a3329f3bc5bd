"""ODEFunc as a staged self-attention in PyTorch; port of ode_ref/attention.py.

The stage order and prepare are the spec's own (ode_ref.attention.Stages); the stages are torch.
Differences, each computing the same values:
  - the module owns its parameters under the seed's names (qkv, out_proj, norm), so prepare
    takes no params argument, and the stage `norm` is the module self.norm (its forward takes
    the prepared norm parameters, as the spec's stage does);
  - attn is torch.nn.functional.scaled_dot_product_attention (dropout on the attention weights
    in training mode only); build_mask returns None when every key is visible, and Causal (the
    decoder's mask, unpadded, not decoding) kept symbolic, which SDPA runs as is_causal: its fused
    kernel then materialises no (seq, seq) tensor per evaluation (a dense bool mask, SDPA expands
    to a float (seq, seq) one at every call). A stage that needs the tensor gets Causal.dense();
  - SDPA returns a zero row for a fully masked query (the spec: a uniform row); only padded
    queries have one, and postprocess_attn zeroes those in both;
  - with ALiBi, the bias and the mask go to SDPA as one additive float mask (the bias where
    visible, the most negative float where not): the spec's values, since exp of either is 0;
  - SDPA's fused CPU kernel (is_causal, or no mask) returns a finite row for a NaN query, where
    the spec's attention returns NaN: attn puts NaN back in the rows of non-finite queries (which
    poison_queries relies on);
  - hide_nonfinite finds the queries that see a non-finite key by the mask's own form: any over
    the keys with no mask, a cumulative any over them under Causal (no (seq, seq) tensor), and a
    product of the visible keys with the bad ones under a tensor (bool, or merge_bias's additive
    mask, whose hidden entries are the most negative float); in eager mode, when k, v and q are
    all finite (a sum of each, one number read), it and attn's NaN rows do nothing else, so every
    tensor, and its layout, is what it was without them;
  - RoPE angles are computed in float64 torch ops (the spec's precision), on the weights' device.
The seed's signatures: ODEFunc(config, pos_encoder=None) and forward(t, x, logical_layer_idx=None,
pos_encoder=None); the padding mask is keyword-only. The encoding is the config's (ode_use_pe,
positional_encoding): a pos_encoder object is accepted and not read (the encoder's parameters
are this module's own pos_encoder, PosEncoder), and logical_layer_idx, when given, is hope's layer
index for that call (docs/specification.md, decisions). PaPE's and BAM's scores are written out,
as ALiBi's; SSMax multiplies q (and the bias), so SDPA runs as it does without it.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ode_ref import attention as spec
from ode_ref.attention import Prepared, Stages, causal_mask
from ode_ref.block import check_dtype, check_input
from ode_ref.config import ODEConfig, dtype_name
from ode_ref.memory import Need, cache_need, check_memory, subject
from ode_ref.precision import DTYPES
from ode_ref.config import BIAS_ENCODINGS, PAPE_ENCODINGS
from ode_ref.params import GATE_BIAS, GATE_WEIGHT, encoder_shapes

from .bitlinear import BitLinear, bitlinear, linear, quantize_weight
from .gemm import PackCache, check_gemm, onednn_linear, runs_onednn
from .norms import Norm
from . import positions as P
from .positions import PosEncoder, rope_cos_sin
from .xp import namespace
from .precision import to_compute, under_policy



class Causal(NamedTuple):
    """The decoder's causal mask over seq_len tokens, unbuilt: attn runs SDPA with is_causal."""

    seq_len: int
    device: Any

    def dense(self):
        """bool (1, 1, seq, seq), True where key j <= query i."""
        return causal_mask(self.seq_len, namespace(self.device))[None, None]


def dense(mask):
    """mask as a tensor (or None): Causal built, anything else as it is."""
    return mask.dense() if isinstance(mask, Causal) else mask


def additive_mask(mask, bias):
    """The bias where mask is True (or everywhere, mask None), the most negative float elsewhere."""
    mask = dense(mask)
    return bias if mask is None else bias.masked_fill(~mask, torch.finfo(bias.dtype).min)


def eager() -> bool:
    """Not compiling or tracing: a stage may read a number and skip work (no data-dependent branch
    in a graph)."""
    return not (torch.compiler.is_compiling() or torch.jit.is_tracing())


def visible_bad(mask, bad):
    """bool (batch, seq_q | 1, heads, 1): whether a key visible under mask (None, Causal, a bool
    or merge_bias's additive float tensor) is bad, bad: bool (batch, seq_k, heads)."""
    if mask is None:
        return bad.any(dim=1, keepdim=True)[..., None]
    if isinstance(mask, Causal):  # query i sees keys j <= i
        return (bad.cumsum(dim=1) > 0)[..., None]
    # (batch | 1, heads | 1, seq_q, seq_k)
    visible = mask > torch.finfo(mask.dtype).min if mask.is_floating_point() else mask
    counts = visible.to(torch.float32) @ bad.transpose(1, 2)[..., None].to(torch.float32)  # (batch, heads, seq_q, 1)
    return (counts > 0).transpose(1, 2)


class SelfAttention(spec.SelfAttention, nn.Module):
    """The seed's ODEFunc: forward(t, x, padding_mask=None) is f evaluated once. The spec's
    SelfAttention over torch (self.xp, xp.py); each stage written here says why torch differs."""

    __call__ = nn.Module.__call__  # forward(t, x), the seed's; the spec's __call__ is evaluate

    def __init__(self, config, pos_encoder=None):
        nn.Module.__init__(self)
        cfg = ODEConfig.from_any(config)
        self.config = cfg
        self.dim, self.num_heads, self.head_dim, self.scale = cfg.hidden_size, cfg.num_heads, cfg.head_dim, cfg.scale
        self.mode = cfg.mode
        linear_cls = BitLinear if cfg.use_bitnet else (lambda i, o: nn.Linear(i, o, bias=False))
        self.qkv = linear_cls(self.dim, 3 * self.dim)
        self.out_proj = linear_cls(self.dim, self.dim)
        self.norm = Norm(cfg.norm_type, self.dim)
        self.dropout = nn.Dropout(cfg.dropout)
        self._packed, self.gemm = PackCache(), "auto"  # the projections' GEMM in inference (gemm.py)
        if encoder_shapes(cfg):  # the seed's encoder parameters, under its names (pos_encoder.X)
            self.pos_encoder = PosEncoder(cfg)

    # ---- once per block (Stages.prepare) --------------------------------------------------
    def prepare(self, x, padding_mask=None, layer_idx=None) -> Prepared:
        """The module owns its parameters, so prepare takes none (Stages.prepare gets the module's)."""
        self.check(x, padding_mask)
        return Stages.prepare(self, None, x, padding_mask, layer_idx)

    def check(self, x, padding_mask=None, *, name: str = "x") -> None:
        """The spec's input checks, and x in the parameters' dtype (one of DTYPES)."""
        check_dtype("parameters", self.qkv.weight.dtype, DTYPES)
        check_input(x, self.config, padding_mask, array_type=torch.Tensor, float_dtypes=DTYPES, bool_dtype=torch.bool,
                    name=name)
        if x.dtype != self.qkv.weight.dtype:
            raise TypeError(
                f"{name}: expected dtype {self.qkv.weight.dtype} (the module's parameter dtype; "
                f"convert the module with .to(dtype)); got {x.dtype}"
            )

    @property
    def gemm(self) -> str:
        """The projections' GEMM in inference: "auto" (the rule), "torch" or "onednn" (gemm.py)."""
        return self._gemm

    @gemm.setter
    def gemm(self, name: str) -> None:
        self._gemm = check_gemm(name)

    def weights(self, params, x):
        """The module's own parameters (params is None): already in x's dtype, checked above. Where
        oneDNN runs the projections, their packed forms are brought up to date, once a forward."""
        qkv, out_proj = self.qkv.weight, self.out_proj.weight
        if self._runs_onednn(x):
            self._packed.refresh(qkv=qkv, out_proj=out_proj)
        else:
            self._packed.clear()
        return qkv, out_proj, dict(self._modules["norm"].named_parameters())

    def _runs_onednn(self, x) -> bool:
        return eager() and not self.config.use_bitnet and runs_onednn(self._gemm, self.qkv.weight, x)

    def encoder_weights(self, params, x):
        """The encoder's own parameters by short name ('ab.weight', 'ssmax.s', ...)."""
        return dict(self.pos_encoder.named_parameters())

    def gate_weights(self, params, x):
        """The gate is the block's (ODEAttentionBlock.gate), not this module's: params holds its
        parameters when the block integrates, and is None when f is evaluated alone."""
        return None if params is None else (params[GATE_WEIGHT], params[GATE_BIAS])

    quantize_weight = staticmethod(quantize_weight)  # the straight-through estimator (bitlinear.py)

    @property
    def norm(self):
        """The nn.Module self.norm (the seed's name), whose forward(norm_params, x) is the stage."""
        return self._modules["norm"]

    @property
    def xp(self):
        """torch under NumPy's names, creating arrays on the parameters' device (xp.py)."""
        return namespace(self.qkv.weight.device)

    def build_mask(self, seq_len: int, padding_mask=None, *, cache_index=None):
        """bool (batch | 1, 1, seq_q, seq_k); None when every key is visible, Causal for the
        decoder's unpadded sequence (SDPA's fused kernels, no (seq, seq) tensor)."""
        mask = None
        if self.mode == "decoder" and padding_mask is None and cache_index is None:
            return Causal(seq_len, self.qkv.weight.device)
        if self.mode == "decoder":
            i, j = self.slot_indices(seq_len, cache_index)
            mask = (j <= i)[None, None]
        if padding_mask is not None:
            keys = padding_mask[:, None, None, :]
            mask = keys if mask is None else mask & keys
        return mask

    def hide_keys(self, mask, visible):
        """A variant's narrowing of the mask (Stages.hide_keys), on the built tensor."""
        return Stages.hide_keys(self, dense(mask), visible)

    # ---- float64 in torch ops on the positions' device (the spec's: NumPy's float64) ------------
    def rope_tables(self, positions, bound: int, like):
        return rope_cos_sin(positions, self.config, like.dtype)

    def hope_tables(self, positions, bound: int, like, layer_idx: int):
        return P.hope_tables(positions, self.config, layer_idx, like.dtype)

    def bam_bias(self, encoder, positions_q, positions_k, like):
        return P.bam_bias(encoder, positions_q, positions_k, self.config, like.dtype)

    def ssmax_factor(self, encoder, positions_q, positions_k, seq_len: int, like):
        lengths = spec.ssmax_lengths(positions_q, positions_k, self.config, seq_len, xp=self.xp)
        return P.ssmax_factor(encoder["ssmax.s"], lengths, like.dtype)

    # ---- the cache's slots, out of place (Stages.prefill, Stages.decode); axis 1 is the slot ----
    def pad_slots(self, a, max_len: int):
        return torch.cat([a, a.new_zeros((a.shape[0], max_len - a.shape[1], *a.shape[2:]))], dim=1)

    def write_slot(self, buffer, new, index):
        """Out of place: the cache given is never written."""
        return torch.slice_scatter(buffer, new, dim=1, start=index, end=index + 1)

    def mark_slot(self, padding_mask, index):
        return torch.slice_scatter(padding_mask, padding_mask.new_ones((padding_mask.shape[0], 1)), dim=1,
                                   start=index, end=index + 1)

    # ---- every evaluation of f: the straight-through BitLinear, SDPA and its mask forms --------
    def _linear(self, x, w):
        """BitLinear, or x @ w.T: through oneDNN where w is a parameter refreshed for it (gemm.py);
        a weight a variant computed from one runs torch's matmul."""
        if self.config.use_bitnet:
            return bitlinear(x, w)
        packed = self._packed.lookup(w) if self._runs_onednn(x) else None
        return linear(x, w) if packed is None else onednn_linear(x, packed)

    def hide_nonfinite(self, k, v, mask):
        """The spec's stage; mask in this port's forms (visible_bad). 0 * x is NaN exactly where x is
        not finite, and a sum of zeros and NaNs is NaN exactly when one is: a few fused kernels,
        where isfinite and all over the head's values cost several times more on the CPU. In eager
        mode, when the sum of every value is finite (one number read, as the norms read theirs;
        a NaN or Inf anywhere makes it NaN or Inf, and an overflow of finite values only takes the
        long way, to the same result), k and v are returned as they are and poison is None."""
        if eager() and torch.isfinite(k.sum() + v.sum()).item():
            return k, v, None
        bad = torch.isnan((k * 0 + v * 0).sum(dim=-1))  # (batch, seq_k, heads)
        return _finite_or_zero(k), _finite_or_zero(v), visible_bad(mask, bad)

    def poison_queries(self, q, poison):
        """masked_fill, not where: the result has q's layout whatever poison's strides, so SDPA and
        the ops after it, whose rounding follows their operands' layouts, keep every finite bit."""
        return q if poison is None else q.masked_fill(poison, float("nan"))

    def merge_bias(self, mask, bias):
        """SDPA takes one mask: with a bias, the additive float mask (the bias where visible)."""
        return (mask, None) if bias is None else (additive_mask(mask, bias), None)

    def attn(self, q, k, v, mask, bias=None):
        """q (batch, seq_q, heads, head_dim), k, v (batch, seq_k, heads, head_dim) -> like q.
        mask: bool, Causal, or merge_bias's additive float mask."""
        if bias is not None:  # a bias passed directly, not merged by prepare
            mask = additive_mask(mask, bias)
        q, k, v = (a.transpose(1, 2) for a in (q, k, v))  # (batch, heads, seq, head_dim)
        causal = isinstance(mask, Causal)
        additive = not causal and mask is not None and mask.is_floating_point()
        if additive or self.config.position_encoding == "hope":
            # Written out, not SDPA, whose CPU backward is less accurate; the forward agrees either
            # way. ALiBi's additive mask: a float64 grad case's x_bar 9.8e-14 from the spec's through
            # SDPA, a rounding written out. hope's logits (about 1e10) make rows exactly one-hot,
            # where the scores' exact gradient is 0: SDPA's backward leaves a rounding of dO . O
            # there, which hope's r cosh(a) (up to 8e4) on q and k carries into x_bar (a float64
            # grad case at seq 8: 4.9e-14 from x_bar computed in long double, the spec's 1.4e-16)
            s = (q @ k.transpose(-2, -1)) * self.scale
            s = s + mask if additive else s if mask is None else s.masked_fill(~dense(mask), torch.finfo(s.dtype).min)
            y = self.dropout(torch.softmax(s, dim=-1)) @ v
            return y.transpose(1, 2)
        p = self.dropout.p if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if causal else mask, dropout_p=p, is_causal=causal,
                                           scale=self.scale)
        if not eager() or not torch.isfinite(q.sum()).item():  # the kernel may drop a non-finite query's NaN
            y = y.masked_fill(torch.isnan((q * 0).sum(dim=-1, keepdim=True)), float("nan"))  # y's layout kept
        return y.transpose(1, 2)  # (batch, seq, heads, head_dim)

    def forward(self, t, x, logical_layer_idx=None, pos_encoder=None, *, padding_mask=None):
        """f(t, x) once; the seed's signature (pos_encoder: accepted, not read; logical_layer_idx:
        hope's layer index for this call, None: the config's layer_idx)."""
        check_seed_arguments(logical_layer_idx)
        self.check(x, padding_mask)
        f, x_c = under_policy(self), to_compute(x, self)  # a half module: the policy, in float32
        check_torch_memory("ODEFunc.forward", f, x_c, padding_mask)  # before prepare builds the mask
        return f.evaluate(Stages.prepare(f, None, x_c, padding_mask, logical_layer_idx), t, x_c).to(x.dtype)


# Arrays of (batch, heads, seq_q, seq_k) alive at once where this port writes the scores out:
# ALiBi's path (the additive mask, the scores, the weights) and SDPA's own math path, which CPU runs
# for dropout in training (measured by peak RSS: 3.0 and 3.5 arrays); hope's path (the scores, the
# weights: 2.06 to 2.31 arrays of live tensor bytes, the decoder's dense mask included)
ALIBI_SCORE_ARRAYS, MATH_SCORE_ARRAYS, HOPE_SCORE_ARRAYS = 3, 4, 2


def memory_needs(attention: SelfAttention, x, padding_mask=None, max_len: int | None = None) -> list[Need]:
    """What a forward (or a prefill of max_len slots) of this port allocates beyond its states,
    from shapes: the scores only where they are written out (ALiBi, hope; CPU dropout in training),
    never for SDPA's fused kernels, which hold none; the dense (seq_q, seq_k) mask and SDPA's
    float copy of it where the decoder's mask meets a padding mask; the cache; and, on a first
    forward through oneDNN (gemm.py), the projections packed and the copies they are checked against."""
    cfg, (batch, seq) = attention.config, x.shape[:2]
    dtype, itemsize = dtype_name(x.dtype), x.element_size()
    scores = (batch, cfg.num_heads, seq, seq)
    needs = []
    if attention._runs_onednn(x) and attention._packed.empty():  # q, k, v (3D, D) and out_proj (D, D), twice
        needs.append(Need("oneDNN's packed projections and their copies", 2, (4 * cfg.hidden_size, cfg.hidden_size),
                          dtype, itemsize))
    if cfg.position_encoding in BIAS_ENCODINGS + PAPE_ENCODINGS:
        what = "the ALiBi scores" if cfg.position_encoding == "alibi" else "the biased scores"
        needs.append(Need(f"{what}, written out", ALIBI_SCORE_ARRAYS, scores, dtype, itemsize))
    elif cfg.position_encoding == "hope":
        needs.append(Need("the hope scores, written out", HOPE_SCORE_ARRAYS, scores, dtype, itemsize))
    elif attention.training and cfg.dropout > 0 and x.device.type == "cpu":
        needs.append(Need("the attention scores (SDPA's math path: dropout on CPU)", MATH_SCORE_ARRAYS, scores,
                          dtype, itemsize))
    if cfg.mode == "decoder" and padding_mask is not None and cfg.position_encoding not in BIAS_ENCODINGS + PAPE_ENCODINGS:
        needs.append(Need("the mask", 1, (batch, 1, seq, seq), "bool", 1))
        if cfg.position_encoding != "hope":  # hope's attention is written out, not SDPA
            needs.append(Need("SDPA's float copy of the mask", 1, (batch, 1, seq, seq), dtype, itemsize))
    if max_len is not None:
        needs.append(cache_need(cfg, batch, max_len, dtype, itemsize))
    return needs


def check_torch_memory(call: str, attention: SelfAttention, x, padding_mask=None, max_len: int | None = None) -> int:
    """ode_ref.memory.check_memory on memory_needs: the estimate in bytes, or MemoryLimitError.
    Skipped (0) while torch.compile or a tracer runs the forward: it reads the environment, which
    a compiled graph would freeze; the eager call is checked."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return 0
    return check_memory(subject(call, x.shape, max_len), *memory_needs(attention, x, padding_mask, max_len))


def check_seed_arguments(logical_layer_idx) -> None:
    """The seed's logical_layer_idx is an int >= 0 or None; anything else (a mask passed
    positionally, say) is refused rather than ignored."""
    if logical_layer_idx is not None and not isinstance(logical_layer_idx, bool) and isinstance(logical_layer_idx, int) \
            and logical_layer_idx < 0:
        raise ValueError(f"logical_layer_idx: expected an integer >= 0 or None; got {logical_layer_idx}")
    if logical_layer_idx is not None and (isinstance(logical_layer_idx, bool) or not isinstance(logical_layer_idx, int)):
        raise TypeError(
            f"logical_layer_idx: expected an int or None (the padding mask is keyword-only: "
            f"padding_mask=...); got {type(logical_layer_idx).__name__}"
        )


ODEFunc = SelfAttention  # the seed's name


def _finite_or_zero(a):
    """a with its NaN and infinite entries 0 (nan_to_num(a, 0, 0, 0), in ops that every exporter
    takes: OpenVINO's torch frontend has no nan_to_num). a * 0 is NaN exactly where a is not finite."""
    return torch.where(torch.isnan(a * 0), torch.zeros((), dtype=a.dtype, device=a.device), a)
