"""The staged attention API's SelfAttention as a flax.linen Module, over the JAX port's stages.

The stages, with the API's names and signatures; Q, K and V are [batch, seq, heads, head_dim]
in every hook:

    _project_inner(x) -> (q, k, v)        the fused c_attn, split into heads
    project(x)                            calls _project_inner
    preprocess_qkv(q, k, v, **kwargs)     RoPE; kwargs["positions"] (batch | 1, seq) count the real
                                          tokens before each one, the cache's included when
                                          decoding; kwargs["t"] is the evaluation's time
    build_mask(t, padding_mask, **kwargs) bool (batch | 1, 1, seq_q, seq_k), True = visible; t is
                                          the sequence length (the cache's when decoding), and
                                          kwargs["_cache_index"] the cache's index after the
                                          single-token update (the API's): the decoded token's
                                          slot + 1 (query_slot)
    attn(q, k, v, mask=None, **kwargs)    softmax(q k^T * scale + kwargs["bias"], masked) v;
                                          a None mask is the config's mode (causal or full)
    postprocess_attn(y, padding_mask, deterministic, **kwargs)
                                          padded queries zeroed; dropout on the `dropout` rng
                                          (or kwargs["dropout_rng"]) unless deterministic
    output_proj(y)                        c_proj, on y (batch, seq, d_model)

A variant subclasses SelfAttention, overrides a stage and calls super() (variants.py). Each
default stage is the JAX port's stage of the same name (backends/jax/attention.py) on this
module's parameters: no formula is written here. The ODE block (block.py) runs the stages in the
spec's order through ModuleStages, a JAX-port SelfAttention whose stages are this module's, so
the orchestration (ode_ref.attention.Stages) and the stepping (ode_ref.rk) are the spec's own.

Parameters (variables['params'] of the module): c_attn.kernel (d_model, 3 d_model) and
c_proj.kernel (d_model, d_model), Flax's Dense layout (kernel = the seed's weight transposed),
and norm.<name> as the seed names them (ode_ref.norms.NORM_PARAMS); with an encoder that holds
parameters (ode_ref.params.encoder_shapes), pos_encoder.<name> under the seed's short names, in
the seed's layout ('ab.weight' (2 H M, d_model), 'ssmax.s' (H,), ...). Their init is the spec's
(ode_ref.params.init_params): U(-1/sqrt(d_model), 1/sqrt(d_model)), the norms' identity values,
and the encoder's (encoder_init: U(-1/sqrt(fan_in), +) for PaPE's weights, U(0.5, 1.5) for
pape_ri's scales, the config's constants for BAM and SSMax).
"""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from ode_ref.attention import causal_mask
from ode_ref.block import check_flag
from ode_ref.config import ODEConfig
from ode_ref.norms import NORM_PARAMS
from ode_ref.params import (GATE_BIAS, GATE_WEIGHT, NORM_PREFIX, OUT_PROJ, POS_PREFIX, QKV, check_params, encoder_init,
                             encoder_shapes, param_shapes)

from ..jax import attention as port
from ..jax import block as jax_block
from ..jax.bitlinear import quantize_weight
from ..jax.norms import apply_norm


def uniform(bound: float):
    """Flax initializer: U(-bound, bound), torch.nn.Linear's default (the spec's init_params)."""

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


@functools.lru_cache(maxsize=None)
def port_stages(config: ODEConfig, stages: type = port.SelfAttention, settings: tuple = ()) -> port.SelfAttention:
    """The JAX port's SelfAttention (or a variant of it, with its settings as (name, value) pairs)
    of a config: the stages the defaults here call. The variant's own checks run here."""
    return stages(config, **dict(settings))


class _Configured(nn.Module):
    """A module whose `config` field takes anything ODEConfig.from_any takes."""

    config: Any

    def __post_init__(self):
        object.__setattr__(self, "config", ODEConfig.from_any(self.config))
        super().__post_init__()

    @property
    def port(self) -> port.SelfAttention:
        return port_stages(self.config)


class Projection(_Configured):
    """A bias-free projection to `features`, BitLinear when the config's use_bitnet: kernel
    (d_model, features), the seed's weight transposed."""

    features: int = 0
    param_dtype: Any = jnp.float32

    def setup(self):
        d = self.config.hidden_size
        self.kernel = self.param("kernel", uniform(d**-0.5), (d, self.features), self.param_dtype)

    def weight(self, like):
        """W (features, d_model) in like's dtype, BitLinear-quantised when use_bitnet."""
        w = self.kernel.T.astype(like.dtype)
        return quantize_weight(w) if self.config.use_bitnet else w

    def __call__(self, x):
        """x (..., d_model) -> (..., features): the JAX port's linear or bitlinear."""
        return self.port._linear(x, self.weight(x))


class Norm(_Configured):
    """The config's pre-norm (ode_ref.norms): its parameters under the seed's names, set to
    their identity values."""

    param_dtype: Any = jnp.float32

    def setup(self):
        d = self.config.hidden_size
        self.values = {name: self.param(name, nn.initializers.constant(identity), (d,) if kind == "vector" else (),
                                        self.param_dtype)
                       for name, (kind, identity) in NORM_PARAMS[self.config.norm_type].items()}

    def __call__(self, z):
        """z (batch, seq, d_model) -> norm(z), the JAX port's apply_norm in z's dtype."""
        return apply_norm(self.config.norm_type, {k: v.astype(z.dtype) for k, v in self.values.items()}, z)


def encoder_initializer(config: ODEConfig, name: str):
    """Flax initializer of one encoder parameter, as the spec's encoder_init draws it: PaPE's
    Linear weights U(-1/sqrt(fan_in), +), pape_ri's scales U(0.5, 1.5), the rest the spec's own
    constant (bam_theta_init, bam_mu_init, ssmax_s_init)."""
    if name.endswith(".weight") or name == "position_scales":
        def init(key, shape, dtype=jnp.float32):
            low, high = (0.5, 1.5) if name == "position_scales" else (-shape[1] ** -0.5, shape[1] ** -0.5)
            return jax.random.uniform(key, shape, dtype, low, high)
        return init
    return lambda key, shape, dtype=jnp.float32: jnp.asarray(encoder_init(config, name, shape, None, False), dtype)


class PosEncoder(_Configured):
    """The positional encoder's parameters (the seed's pos_encoder), by their short names; made
    only for an encoder that holds some (pape, pape_efficient, pape_ri, bam, SSMax)."""

    param_dtype: Any = jnp.float32

    def setup(self):
        self.values = {name: self.param(name, encoder_initializer(self.config, name), shape, self.param_dtype)
                       for name, shape in encoder_shapes(self.config).items()}


class SelfAttention(_Configured):
    """The staged ODE function f as the staged attention API writes it. Override a stage to make
    a variant, keep its signature, and call super() for the default.

    Attributes:
        config: an ODEConfig (or a dict or a seed config object).
        param_dtype: the parameters' dtype at init; the stages compute in the input's dtype."""

    param_dtype: Any = jnp.float32
    # the JAX-port stages the module's stages call, and the fields passed to them: a variant's
    # (variants.py: the spec's variant ported by port_variant)
    stages = port.SelfAttention
    settings = ()

    def __post_init__(self):
        super().__post_init__()
        self.port  # a variant's settings checked now, by the spec's own checks

    @property
    def port(self) -> port.SelfAttention:
        settings = tuple((name, getattr(self, name)) for name in type(self).settings)
        return port_stages(self.config, type(self).stages, settings)

    def setup(self):
        d = self.config.hidden_size
        self.c_attn = Projection(self.config, features=3 * d, param_dtype=self.param_dtype)
        self.c_proj = Projection(self.config, features=d, param_dtype=self.param_dtype)
        self.norm = Norm(self.config, param_dtype=self.param_dtype)
        self.pos_encoder = PosEncoder(self.config, param_dtype=self.param_dtype) if encoder_shapes(self.config) else None
        self.dropout = nn.Dropout(self.config.dropout)

    def state_dict(self) -> dict:
        """This module's parameters under the seed's state_dict names (W = kernel^T)."""
        out = {QKV: self.c_attn.kernel.T, OUT_PROJ: self.c_proj.kernel.T}
        out.update({NORM_PREFIX + name: value for name, value in self.norm.values.items()})
        if self.pos_encoder is not None:
            out.update({POS_PREFIX + name: value for name, value in self.pos_encoder.values.items()})
        return out

    # ---- the stages --------------------------------------------------------------------------
    def _project_inner(self, x):
        """x (batch, seq, d_model) -> q, k, v, each [batch, seq, heads, head_dim]."""
        return self.port.project(self.c_attn.weight(x), x)

    def project(self, x):
        return self._project_inner(x)

    def preprocess_qkv(self, q, k, v, **kwargs):
        """RoPE on q and k (kwargs["rope"], the block's cos and sin, when the config has it)."""
        return self.port.preprocess_qkv(q, k, v, t=kwargs.get("t"), positions=kwargs["positions"], rope=kwargs.get("rope"))

    def build_mask(self, t, padding_mask=None, **kwargs):
        """bool (batch | 1, 1, seq_q, t): padded keys hidden, the causal mask in decoder mode;
        decoding (kwargs["_cache_index"]), the one query at slot _cache_index - 1 of a cache of t
        slots."""
        return self.port.build_mask(t, padding_mask, cache_index=query_slot(kwargs))

    def attn(self, q, k, v, mask=None, **kwargs):
        """q [batch, seq_q, heads, head_dim], k, v [batch, seq_k, ...] -> like q. mask None: the
        config's mode, causal (each of the last seq_q keys' queries) or full."""
        if mask is None and self.config.mode == "decoder":
            mask = causal_mask(k.shape[1], jnp)[k.shape[1] - q.shape[1]:][None, None]
        return self.port.attn(q, k, v, mask, kwargs.get("bias"))

    def postprocess_attn(self, y, padding_mask, deterministic, **kwargs):
        """y [batch, seq, heads, head_dim]: padded queries zeroed, then dropout at the config's
        rate unless deterministic, on kwargs["dropout_rng"] or else the `dropout` rng."""
        y = self.port.postprocess_attn(y, padding_mask)
        return self.dropout(y, deterministic=deterministic, rng=kwargs.get("dropout_rng"))

    def output_proj(self, y):
        """y (batch, seq, d_model) -> y @ W_out^T."""
        return self.port.output_proj(self.c_proj.weight(y), y)

    def __call__(self, x, padding_mask=None, deterministic: bool = True, **kwargs):
        """f(t, x) once (kwargs["t"], default 0): x (batch, seq, d_model) -> (batch, seq, d_model).
        A gated solver's config needs the block's gate parameters too: ODEAttentionBlock.f."""
        check_own_params(self)
        stages = ModuleStages(self, deterministic, dropout_rng(self, deterministic))
        return jax_block.ode_func(self.state_dict(), kwargs.get("t", 0.0), x, self.config, padding_mask, attention=stages)


def query_slot(kwargs: dict):
    """The decoded query's slot from build_mask's kwargs: the API passes _cache_index after the
    single-token cache update, so the query sits at _cache_index - 1; None outside decoding."""
    index = kwargs.get("_cache_index")
    return None if index is None else index - 1


def dropout_rng(module: nn.Module, deterministic: bool, rate=None):
    """The `dropout` rng's key when f drops (not deterministic, a rate above 0), else None:
    drawn once per call, outside every loop; each evaluation of f folds its own key from it.
    rate: the dropout rate (default the config's). ValueError naming rngs when none was given."""
    check_flag("deterministic", deterministic)
    rate = module.config.dropout if rate is None else rate
    if deterministic or rate == 0:
        return None
    if not module.has_rng("dropout"):
        raise ValueError(f"rngs: deterministic=False drops at the config's rate {rate:g}, which needs a 'dropout' "
                         "key: apply(..., deterministic=False, rngs={'dropout': key}); got no 'dropout' rng")
    return module.make_rng("dropout")


def check_own_params(module: "SelfAttention") -> None:
    """The spec's check (check_params) of a SelfAttention's variables['params'] before Flax reads
    them, outside init: params of another config (another width, say) get the spec's one-line
    error naming the parameter, not Flax's ScopeParamShapeError. A gated config's gate lives in
    the block, so it is not asked of the SelfAttention alone."""
    if module.is_initializing():
        return
    named = to_state_dict({"ode_func": dict(module.variables.get("params", {}))})
    gate = {k: np.zeros(shape, np.float32) for k, shape in param_shapes(module.config).items() if k in (GATE_WEIGHT, GATE_BIAS)}
    check_params({**named, **gate}, module.config)


# Every encoder parameter's short name (ode_ref.params.encoder_shapes), in the seed's order
ENCODER_NAMES = ("position.weight", "ab.weight", "position_scales", "a.weight", "theta_alpha", "theta_beta",
                 "theta_mu", "ssmax.s")
# Each seed state_dict name: (its path in variables['params'], stored transposed as a Dense kernel).
PATHS = {QKV: (("ode_func", "c_attn", "kernel"), True), OUT_PROJ: (("ode_func", "c_proj", "kernel"), True),
         GATE_WEIGHT: (("gate", "kernel"), True), GATE_BIAS: (("gate", "bias"), False),
         **{NORM_PREFIX + n: (("ode_func", "norm", n), False) for norm in NORM_PARAMS.values() for n in norm},
         **{POS_PREFIX + n: (("ode_func", "pos_encoder", n), False) for n in ENCODER_NAMES}}


def to_state_dict(variables) -> dict:
    """The parameters of variables (or of variables['params']) under the seed's state_dict names,
    in the seed's order; a leaf at any other path keeps its path ('a/b/c'), so that check_params
    names it as unexpected."""
    if not hasattr(variables, "get"):
        raise TypeError(f"variables: expected a dict ({{'params': ...}} or the params themselves); "
                        f"got {type(variables).__name__}")
    tree = variables.get("params", variables)
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(dict(tree))[0]:
        keys = tuple(getattr(p, "key", str(p)) for p in path)
        name = next((n for n, (where, _) in PATHS.items() if where == keys), "/".join(map(str, keys)))
        out[name] = leaf.T if name in PATHS and PATHS[name][1] else leaf
    norm = {n[len(NORM_PREFIX):] for n in out if n.startswith(NORM_PREFIX)}
    norm_order = next((list(names) for names in NORM_PARAMS.values() if set(names) == norm), sorted(norm))
    order = [QKV, OUT_PROJ, *(NORM_PREFIX + n for n in norm_order), *(POS_PREFIX + n for n in ENCODER_NAMES),
             GATE_WEIGHT, GATE_BIAS]
    return dict(sorted(out.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)))


class ModuleStages(port.SelfAttention):
    """The JAX port's SelfAttention whose stages are a bound Flax SelfAttention's, in the spec's
    signatures: the JAX port's ode_block, prefill and decode run a Flax variant's overrides.
    The norm is the module's; the other stages the port's own (Stages)."""

    def __init__(self, module: SelfAttention, deterministic: bool = True, dropout_rng=None):
        super().__init__(module.config)
        self.module, self.deterministic, self.dropout_rng = module, deterministic, dropout_rng
        self._evaluations, self._t = 0, None

    def norm(self, norm_params: dict, z):
        return self.module.norm(z)

    def project(self, w_qkv, h):
        return self.module.project(h)

    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        self._t = t  # the evaluation's time, for its dropout key
        return self.module.preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)

    def build_mask(self, seq_len: int, padding_mask=None, *, cache_index=None):
        extra = {} if cache_index is None else {"_cache_index": cache_index + 1}  # the index after the update
        return self.module.build_mask(seq_len, padding_mask, **extra)

    def attn(self, q, k, v, mask, bias=None):
        return self.module.attn(q, k, v, mask, bias=bias)

    def _evaluation_key(self):
        """A key of its own for each evaluation of f: the call's key folded with the stage's place
        in the trace and the evaluation's time (a traced step repeats the places, not the times)."""
        if self.dropout_rng is None:
            return None
        self._evaluations += 1
        t = jax.lax.bitcast_convert_type(jnp.asarray(self._t, jnp.float32), jnp.uint32)
        return jax.random.fold_in(jax.random.fold_in(self.dropout_rng, self._evaluations), t)

    def postprocess_attn(self, y, padding_mask=None):
        return self.module.postprocess_attn(y, padding_mask, self.deterministic, dropout_rng=self._evaluation_key())

    def output_proj(self, w_out, y):
        return self.module.output_proj(y)
