"""The ODE attention block: z(1) = z(0) + integral_0^1 f(t, z) dt, by a fixed-step explicit RK.

    ode_func(params, t, x, config)   f evaluated once
    ode_block(params, x, config)     z(1), or (z(1), trajectory) with return_trajectory=True
    prefill(params, x, config, padding_mask=None, *, max_len) -> (z(1), cache)
    decode_step(params, x_t, cache, config) -> (z_t, cache)   decoder mode; cache.py

x is (batch, seq, d_model); float64 in gives float64 math (the golden mode), float32 in gives
float32 math. The same parameters serve every step and stage. This is evaluation: no dropout.
"""

from __future__ import annotations

import sys

import numpy as np

from .attention import SelfAttention, Stages, of_the_spec
from .cache import check_decode_input, check_max_len, check_mode
from .config import ODEConfig, dtype_name
from .memory import cache_need, check_memory, scores_needs, subject
from .params import check_params

# Input dtypes: float32 and float64 everywhere; float16 and bfloat16 too in the ports (torch, JAX),
# which run them under the half-precision policy (precision.DTYPES, declared there with the policy:
# stored in the half dtype, computed in float32 between its rounding points).
# The spec's own ode_block takes float32 and float64 only (NumPy has no bfloat16); its policy run
# is ode_ref.half_block, which a half input to ode_block is told to use. Any other dtype (an
# integer, float8, complex) is refused everywhere by check_dtype, in one message shape.
SPEC_DTYPES = ("float32", "float64")
HALF_HINT = "; for float16 or bfloat16 use ode_ref.half_block (the spec under the half-precision policy)"


def check_dtype(name: str, dtype, allowed=SPEC_DTYPES) -> None:
    """TypeError naming the argument unless dtype is one of the allowed names (a half dtype given to
    the spec's float32/float64 path is told where its policy run is)."""
    got = dtype_name(dtype)
    if got not in allowed:
        hint = HALF_HINT if got in ("float16", "bfloat16") and not set(allowed) & {"float16", "bfloat16"} else ""
        raise TypeError(f"{name}: expected dtype {' or '.join(allowed)}; got {got}{hint}")


def check_flag(name: str, value) -> bool:
    """value as a bool, if it is one (True or False, or NumPy's np.bool_): TypeError naming the
    option otherwise. A string such as "no" would otherwise count as true."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name}: expected True or False; got {value!r} ({type(value).__name__})")
    return bool(value)


def check_input(x, config, padding_mask=None, *, array_type=np.ndarray, float_dtypes=SPEC_DTYPES,
                bool_dtype=np.bool_, name: str = "x"):
    """Raise TypeError/ValueError unless x is (batch, seq, d_model) float and the mask fits it.

    array_type, float_dtypes (names, a subset of precision.DTYPES) and bool_dtype let a backend run the
    same checks on its own arrays.
    """
    cfg = ODEConfig.from_any(config)  # an ODEConfig passes through unchanged
    kind = f"{array_type.__module__.split('.')[0]}.{array_type.__name__.rsplit('.', 1)[-1]}"
    if not isinstance(x, array_type):
        raise TypeError(f"{name}: expected a {kind}; got {type(x).__name__}")
    if x.ndim != 3 or x.shape[-1] != cfg.hidden_size or 0 in tuple(x.shape):
        raise ValueError(
            f"{name}: expected shape (batch, seq, {cfg.hidden_size}) with batch, seq >= 1; got {tuple(x.shape)}"
        )
    check_dtype(name, x.dtype, float_dtypes)
    if padding_mask is not None:
        if not isinstance(padding_mask, array_type) or padding_mask.dtype != bool_dtype:
            got = padding_mask.dtype if isinstance(padding_mask, array_type) else type(padding_mask).__name__
            raise TypeError(f"padding_mask: expected a bool {kind} (True = real token); got {got}")
        if tuple(padding_mask.shape) != tuple(x.shape[:2]):
            raise ValueError(
                f"padding_mask: expected shape {tuple(x.shape[:2])} (batch, seq); got {tuple(padding_mask.shape)}"
            )


PORT_NAMES = {"ode_ref": "spec", "odeattn.backends.torch": "torch", "odeattn.backends.jax": "JAX"}


def _package(cls: type) -> str:
    """'odeattn.backends.torch' for a class of odeattn.backends.torch.attention, 'ode_ref' for the spec's."""
    return cls.__module__.rpartition(".")[0] or cls.__module__


def _named(obj) -> str:
    """How a message names what was passed as a variant: a class, an instance, anything else."""
    cls = obj if isinstance(obj, type) else type(obj)
    whose = "the spec's " if of_the_spec(cls) else ""
    full = f"{cls.__module__}.{cls.__qualname__}"
    return f"{whose or 'the '}class {full}" if isinstance(obj, type) else f"an instance of {whose}{full}"


def _of_port(cls: type, default: type) -> bool:
    """Whether cls is the port's SelfAttention default or a variant of it (a port's class, which
    subclasses the spec's, is not the spec's)."""
    return issubclass(cls, default) and (default is not SelfAttention or of_the_spec(cls))


def _example(obj, default: type) -> str:
    """What to pass instead of obj (a class, another port's variant, anything) to a port whose
    SelfAttention is default."""
    cls = obj if isinstance(obj, type) else type(obj)
    package = _package(default)
    if _of_port(cls, default):
        return f"{cls.__name__}(config, ...)"  # the right class, not instantiated
    if not issubclass(cls, Stages):
        return f"{package}.SelfAttention(config) or a variant, {package}.LocalWindowAttention(config, window=2)"
    shipped = getattr(sys.modules.get(package), cls.__name__, None)
    if isinstance(shipped, type) and issubclass(shipped, default) and shipped.__qualname__ == cls.__qualname__:
        return f"{package}.{cls.__name__}(config, ...)"  # the same variant, as this port ships it
    if of_the_spec(cls):  # the spec's variant, to be ported
        return f"port_variant({cls.__name__}, {package}.SelfAttention)(config, ...)"
    if default is SelfAttention:  # another port's variant, to the spec: the class it was ported from
        return f"{cls.__name__}(config, ...) of the spec's class, not the port's"
    return f"port_variant(the spec's {cls.__name__}, {package}.SelfAttention)(config, ...)"


def check_attention(attention, default: type = SelfAttention, *, name: str = "attention") -> None:
    """TypeError, in one line saying what to pass, unless attention is an instance of the port's
    SelfAttention default (or of a variant of it): a class passed uninstantiated, the spec's
    variant given to a port (instead of port_variant's class), or another port's."""
    if not isinstance(attention, type) and _of_port(type(attention), default):
        return
    package = _package(default)
    port = PORT_NAMES.get(package, package)
    wanted = ("the spec's SelfAttention or a variant of it" if default is SelfAttention else
              f"a {port} SelfAttention ({package}.SelfAttention or a variant ported to it)")
    raise TypeError(f"{name}: expected an instance of {wanted}, e.g. {_example(attention, default)}; "
                    f"got {_named(attention)}")


def attention_for(cfg: ODEConfig, attention=None, default=SelfAttention, *, name: str = "attention"):
    """The attention to run: the given one (a variant), else default(cfg); every port uses this.
    TypeError if it is not an instance of default (check_attention), ValueError if the variant
    was built with another config."""
    attention = default(cfg) if attention is None else attention
    check_attention(attention, default, name=name)
    if attention.config != cfg:
        raise ValueError(f"{name}: its config {attention.config} differs from config {cfg}")
    return attention


def check_spec_memory(call: str, cfg: ODEConfig, x, padding_mask=None, max_len: int | None = None) -> int:
    """The spec's estimate for a call on x (bytes), or MemoryLimitError: the attention's scores
    over x's sequence (memory.scores_needs) and, for prefill, the cache of max_len slots."""
    batch, seq = x.shape[:2]
    dtype, itemsize = dtype_name(x.dtype), x.dtype.itemsize
    needs = scores_needs(cfg, batch, seq, seq, dtype, itemsize, padding_mask is not None)
    if max_len is not None:
        needs.append(cache_need(cfg, batch, max_len, dtype, itemsize))
    return check_memory(subject(call, x.shape, max_len), *needs)


def _checked(params, x, config, padding_mask, attention):
    cfg = ODEConfig.from_any(config)
    check_params(params, cfg)
    check_input(x, cfg, padding_mask)
    return cfg, attention_for(cfg, attention)


def _setup(params, x, config, padding_mask, attention, call: str):
    cfg, attention = _checked(params, x, config, padding_mask, attention)
    check_spec_memory(call, cfg, x, padding_mask)
    return cfg, attention, attention.prepare(params, x, padding_mask)


def ode_func(params, t, x, config, padding_mask=None, *, attention=None):
    """f(t, x): (batch, seq, d_model) -> (batch, seq, d_model), one evaluation."""
    _, attention, prepared = _setup(params, x, config, padding_mask, attention, "ode_func")
    return attention(prepared, t, x)


def ode_block(params, x, config, padding_mask=None, *, attention=None, return_trajectory=False):
    """z(1) for z(0) = x: (batch, seq, d_model) -> (batch, seq, d_model). config: an ODEConfig,
    a dict or a seed config object, normalised here once.

    With return_trajectory=True, returns (z1, trajectory) where trajectory is
    (ode_steps + 1, batch, seq, d_model): z at t = 0, 1/steps, ..., 1.
    attention: a SelfAttention (or a subclass: a variant) built with the same config.
    """
    _, attention, prepared = _setup(params, x, config, padding_mask, attention, "ode_block")
    states = attention.integrate(prepared, x)
    if return_trajectory:
        return states[-1], np.stack(states)
    return states[-1]


def prefill(params, x, config, padding_mask=None, *, max_len: int, attention=None):
    """(z(1) of the prompt x (batch, seq, d_model), a KVCache of max_len slots), decoder mode only.
    Left padding: the prompt's padding_mask; every decoded token is real."""
    cfg = ODEConfig.from_any(config)
    check_mode(cfg)
    _, attention = _checked(params, x, cfg, padding_mask, attention)
    max_len = check_max_len(max_len, x.shape[1])
    check_spec_memory("prefill", cfg, x, padding_mask, max_len)
    return attention.prefill(params, x, padding_mask, max_len)


def decode_step(params, x_t, cache, config, *, attention=None):
    """(z(1) of the next token x_t (batch, 1, d_model), a new cache holding it); the cache given
    is left as it was, so a step can be replayed."""
    cfg = ODEConfig.from_any(config)
    check_params(params, cfg)
    check_input(x_t, cfg, name="x_t")
    cache = check_decode_input(x_t, cache, cfg)
    return attention_for(cfg, attention).decode(params, x_t, cache)
