"""Parameters: names, shapes, initialisation, checking, and pickle-free files.

Names are the seed module's state_dict keys, so a seed checkpoint converts by copying:

    ode_func.qkv.weight       (3 d_model, d_model)
    ode_func.out_proj.weight  (d_model, d_model)
    ode_func.norm.<name>      per norm type, see norms.NORM_PARAMS ((d_model,) or ())
    pos_encoder.<name>        the encoder's, when one is in effect (encoder_shapes; H heads,
                              M = pape_num_parabolas):
        pape, pape_efficient  position.weight (H M, 1), ab.weight (2 H M, d_model)
        pape_ri               position_scales (1, H, 1, 1), a.weight (H, d_model)
        bam                   theta_alpha (H,), theta_beta (H,), theta_mu (H,) when bam_learn_mu
        use_ssmax             ssmax.s (H,)
    gate.weight               (1, 2 d_model)  the gated solver (rk2_gated) only, at block level
    gate.bias                 (1,)            likewise

The seed holds its encoder twice (the block's and ODEFunc's), so its state_dict has each encoder
tensor as pos_encoder.X and ode_func.pos_encoder.X; the spec's parameters hold pos_encoder.X once
(a port's loader takes both, backends/torch/params.py). pape_ri's position_scales is a saved
parameter here, under the seed's (non-persistent) buffer name.
"""

from __future__ import annotations

import os

import numpy as np

from .config import ODEConfig
from .norms import NORM_PARAMS
from .multistep import solver

QKV = "ode_func.qkv.weight"
OUT_PROJ = "ode_func.out_proj.weight"
NORM_PREFIX = "ode_func.norm."
GATE_WEIGHT, GATE_BIAS = "gate.weight", "gate.bias"
POS_PREFIX = "pos_encoder."
SSMAX_S = POS_PREFIX + "ssmax.s"


def encoder_shapes(cfg: ODEConfig) -> dict[str, tuple[int, ...]]:
    """The encoder's parameter names (short, without pos_encoder.) with their shapes."""
    h, d, m, encoding = cfg.num_heads, cfg.hidden_size, cfg.pape_num_parabolas, cfg.position_encoding
    shapes = {}
    if encoding in ("pape", "pape_efficient"):
        shapes = {"position.weight": (h * m, 1), "ab.weight": (2 * h * m, d)}
    elif encoding == "pape_ri":
        shapes = {"position_scales": (1, h, 1, 1), "a.weight": (h, d)}  # torch's order: own tensors first
    elif encoding == "bam":
        shapes = {"theta_alpha": (h,), "theta_beta": (h,), **({"theta_mu": (h,)} if cfg.bam_learn_mu else {})}
    if cfg.ssmax:
        shapes["ssmax.s"] = (h,)
    return shapes


def param_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every parameter name of the config with its shape, in the seed's state_dict order."""
    return _shapes(ODEConfig.from_any(config))


def _shapes(cfg: ODEConfig) -> dict[str, tuple[int, ...]]:
    d = cfg.hidden_size
    shapes = {QKV: (3 * d, d), OUT_PROJ: (d, d)}
    for name, (kind, _) in NORM_PARAMS[cfg.norm_type].items():
        shapes[NORM_PREFIX + name] = (d,) if kind == "vector" else ()
    shapes.update({POS_PREFIX + name: shape for name, shape in encoder_shapes(cfg).items()})
    if solver(cfg.ode_solver).gated:
        shapes[GATE_WEIGHT], shapes[GATE_BIAS] = (1, 2 * d), (1,)
    return shapes


def init_params(config, seed: int = 0, *, perturb_norms: bool = False, dtype=np.float64) -> dict:
    """Deterministic parameters for a config (same values on every platform for a seed).

    Distributions (NumPy's PCG64 generator seeded with `seed`, drawn in name order):
      - qkv and out_proj weights: U(-1/sqrt(d_model), 1/sqrt(d_model)), torch.nn.Linear's default.
      - norm parameters: their identity values (weights and gains 1, biases and shifts 0).
        With perturb_norms=True each gets identity + U(-0.5, 0.5) instead, so that a test or a
        golden case exercises every norm parameter.
      - the gate (rk2_gated): weight Xavier-uniform, U(-sqrt(6 / (2 d_model + 1)), +sqrt(...)),
        the paper's init; bias 0, or U(-0.5, 0.5) with perturb_norms=True (a zero bias would let
        a port that drops it pass).
      - the encoder's (encoder_init): PaPE's Linear weights as torch.nn.Linear's default
        (position: fan_in 1, U(-1, 1)); pape_ri's position_scales U(0.5, 1.5) (the seed draws them
        at random and does not save them); bam's thetas bam_theta_init and its mu bam_mu_init,
        ssmax.s ssmax_s_init, each + U(-0.5, 0.5) with perturb_norms=True (at init BAM's bias is
        the constant -1, which a port that drops the positions would match).
    """
    cfg = ODEConfig.from_any(config)
    rng = np.random.default_rng(seed)
    bound = 1.0 / np.sqrt(cfg.hidden_size)
    params = {}
    for name, shape in _shapes(cfg).items():
        if name in (QKV, OUT_PROJ):
            value = rng.uniform(-bound, bound, size=shape)
        elif name == GATE_WEIGHT:
            value = rng.uniform(-1.0, 1.0, size=shape) * np.sqrt(6.0 / sum(shape))  # fan_in + fan_out
        elif name == GATE_BIAS:
            value = rng.uniform(-0.5, 0.5, size=shape) if perturb_norms else np.zeros(shape)
        elif name.startswith(POS_PREFIX):
            value = encoder_init(cfg, name[len(POS_PREFIX):], shape, rng, perturb_norms)
        else:
            identity = NORM_PARAMS[cfg.norm_type][name[len(NORM_PREFIX):]][1]
            value = np.full(shape, identity)
            if perturb_norms:
                value = value + rng.uniform(-0.5, 0.5, size=shape)
        params[name] = np.asarray(value, dtype=dtype)
    return params


def encoder_init(cfg: ODEConfig, name: str, shape, rng, perturb: bool):
    """One encoder parameter's initial value (init_params' docstring)."""
    if name.endswith(".weight"):
        bound = 1.0 / np.sqrt(shape[1])  # torch.nn.Linear's default: U(-1/sqrt(fan_in), +)
        return rng.uniform(-bound, bound, size=shape)
    if name == "position_scales":
        return rng.uniform(0.5, 1.5, size=shape)
    start = {"theta_alpha": cfg.bam_theta_init, "theta_beta": cfg.bam_theta_init, "theta_mu": cfg.bam_mu_init,
             "ssmax.s": cfg.ssmax_s_init}[name]
    return np.full(shape, start) + (rng.uniform(-0.5, 0.5, size=shape) if perturb else 0.0)


def encoder_params_of(params: dict, cfg: ODEConfig) -> dict:
    """The encoder's parameters by short name ('ab.weight', 'theta_alpha', ...)."""
    return {name: np.asarray(params[POS_PREFIX + name]) for name in encoder_shapes(cfg)}


def check_params(params, config) -> None:
    """Raise ValueError unless params has exactly the config's names, shapes and float dtypes.
    config: anything ODEConfig.from_any takes (an ODEConfig passes through unchanged)."""
    cfg = ODEConfig.from_any(config)
    expected = _shapes(cfg)
    if not hasattr(params, "keys"):
        raise ValueError(f"params: expected a dict of arrays; got {type(params).__name__}")
    missing = [k for k in expected if k not in params]
    extra = sorted(k for k in params if k not in expected)
    if missing or extra:
        raise ValueError(
            f"params: for norm_type={cfg.norm_type!r}, ode_solver={cfg.ode_solver!r}"
            f"{_encoder_words(cfg)} expected exactly {list(expected)}; "
            f"missing {missing}, unexpected {extra}"
        )
    for name, shape in expected.items():
        if not hasattr(params[name], "dtype"):
            raise ValueError(f"params[{name!r}]: expected an array; got {type(params[name]).__name__}")
        got = tuple(np.shape(params[name]))
        if got != shape:
            raise ValueError(f"params[{name!r}]: expected shape {shape}; got {got}")
        value = params[name]
        dtype = np.dtype(value.dtype) if hasattr(value, "dtype") else np.asarray(value).dtype  # traced arrays too
        if dtype.kind != "f" and dtype.name != "bfloat16":
            raise ValueError(f"params[{name!r}]: expected a floating dtype; got {dtype}")


def _encoder_words(cfg: ODEConfig) -> str:
    """', positional_encoding='bam', use_ssmax=True' where an encoder holds parameters, else ''."""
    words = "" if cfg.position_encoding in ("none", "rope", "alibi", "sinusoidal_rotary", "hope") \
        else f", positional_encoding={cfg.position_encoding!r}"
    return words + (", use_ssmax=True" if cfg.ssmax else "")


def norm_params_of(params: dict, norm_type: str) -> dict:
    """The norm's parameters by short name ('weight', 'alpha', ...)."""
    return {name: np.asarray(params[NORM_PREFIX + name]) for name in NORM_PARAMS[norm_type]}


def save_params(params: dict, path) -> None:
    """Write params to .safetensors (needs the safetensors package) or .npz (NumPy only), the
    suffix in any case (W.NPZ is an .npz, written under that very name). Only numeric arrays: an
    object array would make the .npz need unpickling, so it is refused. Written whole or not at
    all (files.replacing): a failure leaves a file already at path as it was."""
    from .files import replacing

    arrays = {k: np.asarray(v, order="C") for k, v in params.items()}  # keeps 0-d shapes
    for name, value in arrays.items():
        if value.dtype.kind not in "biuf":
            raise ValueError(f"params[{name!r}]: expected a numeric array; got dtype {value.dtype}")
    ext = _extension(path)
    try:
        with replacing(path) as tmp:
            if ext == ".npz":
                with open(tmp, "wb") as f:  # a file object: np.savez adds no second suffix
                    np.savez(f, **arrays)
            else:
                from safetensors.numpy import save

                data = _safetensors_bytes(save, arrays, path)
                with open(tmp, "wb") as f:
                    f.write(data)
    except OSError as err:
        raise OSError(f"params file {os.fspath(path)!r}: cannot be written ({err.strerror})") from None


def _safetensors_bytes(save, arrays: dict, path) -> bytes:
    """safetensors' serialisation of arrays; ValueError naming the array and the file for a dtype
    it has no type for (float128, say) instead of its own error."""
    try:
        return save(arrays)
    except Exception as err:  # safetensors raises its own types for a dtype it cannot store
        bad = next((k for k, v in arrays.items() if _unstorable(save, v)), None)
        what = f"params[{bad!r}]: dtype {arrays[bad].dtype}" if bad else "params"
        raise ValueError(f"{what} cannot be stored in the safetensors file {os.fspath(path)!r} ({err})") from None


def _unstorable(save, value) -> bool:
    try:
        save({"a": value})
    except Exception:
        return True
    return False


def load_params(path) -> dict:
    """Read params from .safetensors or .npz; never unpickles (allow_pickle=False)."""
    ext = _extension(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"params file: no such file {os.fspath(path)!r}")
    if ext == ".npz":
        return _load_npz(path)
    from safetensors.numpy import load_file

    try:
        return load_file(os.fspath(path))
    except Exception as err:  # safetensors raises its own error types for corrupt headers
        raise ValueError(f"params file {os.fspath(path)!r}: not a readable safetensors file ({err})") from err


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")  # a zip archive's first bytes (one with members, an empty one)


def _not_npz(path, why: str) -> ValueError:
    return ValueError(f"params file {os.fspath(path)!r}: not a NumPy .npz archive of arrays ({why})")


def _load_npz(path) -> dict:
    """The arrays of an .npz. Anything else named .npz (a pickle, a single .npy, text) is refused
    by its first bytes before NumPy reads it: np.load would otherwise take a non-zip file for a
    pickle and answer with its own advice on unpickling, naming no file."""
    import zipfile

    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as err:
        raise ValueError(f"params file {os.fspath(path)!r}: cannot be read ({err.strerror})") from None
    if head[:4] not in _ZIP_MAGIC:
        why = ("it is empty" if not head else "it is a pickle, which is never loaded" if head[:1] == b"\x80"
               else "it is a single .npy array, not a zip archive of named ones" if head == b"\x93NUMPY"
               else f"it starts with {head!r}, not a zip archive's bytes")
        raise _not_npz(path, why)
    try:
        with np.load(path, allow_pickle=False) as data:
            others = [n for n in data.zip.namelist() if not n.endswith(".npy")]
            if others:
                raise ValueError(f"params file {os.fspath(path)!r}: member {others[0]!r} is not an .npy array")
            arrays = {}
            for k in data.files:
                try:
                    arrays[k] = data[k]
                except ValueError as err:  # an object array (NumPy would need to unpickle it), or a damaged member
                    why = "it holds pickled objects, which are never loaded" if "pickle" in str(err) else str(err)
                    raise _not_npz(path, f"member {k + '.npy'!r}: {why}") from None
            return arrays
    except (zipfile.BadZipFile, EOFError, OSError) as err:
        raise ValueError(f"params file {os.fspath(path)!r}: not a readable .npz file ({err})") from None


def _extension(path) -> str:
    ext = os.path.splitext(os.fspath(path))[1].lower()
    if ext not in (".safetensors", ".npz"):
        raise ValueError(f"params file: expected a name ending in .safetensors or .npz; got {os.fspath(path)!r}")
    return ext
