"""ODEConfig: the one configuration object of an ODE attention block.

The field names are the seed module's config attribute names, so a seed config object converts
with ``ODEConfig.from_any(obj)``. The defaults are odeattn's, not the seed's: the seed defaults to
a 2048-wide BitNet block with dropout 0.1 and dynamic_tanh, a training configuration; ours default
to the plain float block (layer_norm, no BitLinear, no dropout) that a reader checks by hand.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from .multistep import MOMENTUM_GAMMA, MULTISTEP, check_momentum_gamma
from .norms import NORM_PARAMS
from .tableaus import TABLEAUS

SOLVERS: tuple[str, ...] = (*TABLEAUS, *MULTISTEP)  # the RK tableaus, then the multistep solvers (multistep.py)
MODES: tuple[str, ...] = ("encoder", "decoder")
# The positional encodings, by the seed's names. The four null ones act outside f (at the embeddings)
NULL_ENCODINGS: tuple[str, ...] = ("none", "nope", "sinusoidal_absolute", "learned_absolute")
ROTARY_ENCODINGS: tuple[str, ...] = ("rope", "sinusoidal_rotary")  # the seed's rotation, two configs
PAPE_ENCODINGS: tuple[str, ...] = ("pape", "pape_efficient", "pape_ri")  # a bias from the query's state
BIAS_ENCODINGS: tuple[str, ...] = ("alibi", "bam")  # a bias from the positions alone, once per block
ENCODINGS: tuple[str, ...] = (*NULL_ENCODINGS, *ROTARY_ENCODINGS, "hope", *BIAS_ENCODINGS, *PAPE_ENCODINGS)
SSMAX_LENGTHS: tuple[str, ...] = ("visible", "padded")  # what n is in SSMax's s * ln(n) (positions.py)
# The most steps a block takes (ode_steps, and the Loop form's steps input): past it a call runs for
# hours, not a step count anyone means; the golden manifest's sizes share the bound (golden.MAX_SIZE)
MAX_STEPS = 1 << 16


def dtype_name(dtype) -> str:
    """'float32' for np.float32, jnp.float32 and torch.float32 alike."""
    return str(dtype).rpartition(".")[2]


def stored_fields(config) -> dict[str, Any]:
    """A config (ODEConfig, ODEEncoderConfig) as stored and sent: its required fields and those that
    differ from the defaults, so that a field added later with a default leaves what was stored unchanged."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if f.default is dataclasses.MISSING or getattr(config, f.name) != f.default}


def _choice(field: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{field}: expected one of {', '.join(map(repr, choices))}; got {value!r}")


def _real(field: str, value: Any, *, minimum: float | None = None, strict: bool = False) -> float:
    """value as a finite float (NumPy floats too, bools not), > minimum when strict, >= it otherwise."""
    bad = isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not np.isfinite(value)
    if not bad and minimum is not None:
        bad = value <= minimum if strict else value < minimum
    if bad:
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum:g}"
        raise ValueError(f"{field}: expected a finite number{bound}; got {value!r}")
    return float(value)


def _positive_int(field: str, value: Any, minimum: int = 1) -> int:
    """value as an int (NumPy integers too, bools not); ValueError naming the field otherwise."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field}: expected an integer >= {minimum}; got {value!r}")
    return int(value)


def field_values(cls, obj: Any, required: tuple[str, ...]) -> dict[str, Any]:
    """The fields of the dataclass cls read from obj: a dict of field names (an unknown key is
    refused, it is likely a typo) or any object with them as attributes (others ignored); a
    ValueError names a required field obj lacks."""
    names = [f.name for f in dataclasses.fields(cls)]
    if isinstance(obj, Mapping):
        unknown = sorted(set(obj) - set(names))
        if unknown:
            near = {k: difflib.get_close_matches(k, names, n=1) for k in unknown}
            if all(near.values()):  # each a typo of a field: name those, not all the fields
                guesses = ", ".join(f"{n[0]!r}" for n in near.values())
                raise ValueError(f"config: unknown key(s) {unknown}; did you mean {guesses}?")
            raise ValueError(f"config: unknown key(s) {unknown}; expected a subset of {names}")
        values = dict(obj)
    else:
        values = {n: getattr(obj, n) for n in names if hasattr(obj, n)}
    for name in required:
        if name not in values:
            raise ValueError(f"{name}: required, but the config {type(obj).__name__} has none")
    return values


@dataclass(frozen=True)
class ODEConfig:
    hidden_size: int  # d_model, the width of every token state
    num_heads: int  # heads; head_dim = hidden_size // num_heads must be exact
    dropout: float = 0.0  # on attention weights, training only; the spec is evaluation (no dropout)
    use_bitnet: bool = False  # BitLinear (BitNet b1.58) in place of both projections
    norm_type: str = "layer_norm"  # pre-norm applied at every evaluation of f
    ode_solver: str = "rk4"  # a Butcher tableau name ("rk4" is classical RK4, "rk38" the 3/8 rule) or a multistep solver's
    ode_steps: int = 2  # fixed steps over t in [0, 1]; h = 1 / ode_steps
    momentum_gamma: float = MOMENTUM_GAMMA  # the momentum solver's gamma (momentumnet's default, 0.9), in [0, 1)
    mode: str = "encoder"  # "decoder" adds the causal mask j <= i
    # Positions, with the seed's names and defaults: the encoding is read only when ode_use_pe is
    # on (off, any string is kept and ignored, as the seed does); see positions.py
    positional_encoding: str = "rope"  # one of ENCODINGS; "rope" is rotary in the seed's convention
    ode_use_pe: bool = False
    rope_base: float = 10000.0  # rotary frequencies base ** (-i / (P - 1)), P = head_dim // 2
    rope_scaling: float = 1.0  # rotary angle = position * rope_scaling * frequency
    alibi_scale: float = 1.0  # alibi: every head's slope times this factor (> 0; 1 is Press and Smith's)
    # The rest of the seed's positional family (positions.py; docs/positions.md), its names and defaults
    sinusoidal_max_len: int = 512  # sinusoidal_rotary: the seed's float32 table length (the spec has none)
    sinusoidal_base: float = 10000.0  # sinusoidal_rotary: RoPE with this base and scale
    sinusoidal_scale: float = 1.0
    hope_base: float = 10000.0  # hope: the frequencies' base
    hope_damping: float = 0.01  # hope: r = exp(-damping * g * p), >= 0
    layer_idx: int = 0  # hope: the seed's logical_layer_idx (None there means 0); g = 1 + 0.05 * layer_idx
    pape_num_parabolas: int = 4  # pape, pape_efficient: M parabolas per head
    pape_num_positions: int = 1  # pape, pape_efficient: 1 (the seed crashes on more); pape_ri: its factor n
    bam_learn_mu: bool = False  # bam: theta_mu a parameter, else the fixed bam_mu_init
    bam_theta_init: float = 0.0  # bam: theta_alpha and theta_beta at init
    bam_mu_init: float = 0.0
    bam_eps: float = 1e-5  # bam: > 0
    use_ssmax: bool = False  # SSMax: scores * s_h * ln(n), with any encoding in effect (ode_use_pe on)
    ssmax_s_init: float = 1.0  # > 0
    ssmax_length: str = "visible"  # n: "visible" keys of each query, or "padded" (the seed's: the padded length)

    def __post_init__(self) -> None:
        # NumPy integers and booleans (read from arrays or checkpoints) become Python ones
        for name in ("hidden_size", "num_heads", "ode_steps"):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        if self.ode_steps > MAX_STEPS:
            raise ValueError(f"ode_steps: expected an integer in [1, {MAX_STEPS}]; got {self.ode_steps}")
        for name in ("use_bitnet", "ode_use_pe", "bam_learn_mu", "use_ssmax"):
            if isinstance(getattr(self, name), np.bool_):
                object.__setattr__(self, name, bool(getattr(self, name)))
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size: expected a multiple of num_heads={self.num_heads}; "
                f"got {self.hidden_size}"
            )
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not (
            0.0 <= self.dropout < 1.0
        ):
            raise ValueError(f"dropout: expected a number in [0, 1); got {self.dropout!r}")
        if not isinstance(self.use_bitnet, bool):
            raise ValueError(f"use_bitnet: expected True or False; got {self.use_bitnet!r}")
        _choice("norm_type", self.norm_type, tuple(NORM_PARAMS))  # read live: a registered norm counts
        if self.norm_type == "dynamic_tanh" and self.hidden_size < 2:
            raise ValueError(
                "hidden_size: dynamic_tanh divides by the unbiased std (n - 1), so it needs "
                f"hidden_size >= 2; got {self.hidden_size}"
            )
        _choice("ode_solver", self.ode_solver, (*TABLEAUS, *MULTISTEP))  # likewise a registered tableau
        object.__setattr__(self, "momentum_gamma", check_momentum_gamma(self.momentum_gamma, self.ode_solver))
        _choice("mode", self.mode, MODES)
        if not isinstance(self.ode_use_pe, bool):
            raise ValueError(f"ode_use_pe: expected True or False; got {self.ode_use_pe!r}")
        if not isinstance(self.positional_encoding, str):
            raise ValueError(f"positional_encoding: expected a string; got {self.positional_encoding!r}")
        if self.ode_use_pe and self.positional_encoding not in ENCODINGS:
            raise ValueError(
                f"positional_encoding: {self.positional_encoding!r} is not implemented; expected one of "
                f"{', '.join(map(repr, ENCODINGS))} (or ode_use_pe=False, which ignores it)"
            )
        self._check_family()
        for name in ("rope_base", "rope_scaling"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not (
                np.isfinite(value) and value > 0
            ):
                raise ValueError(f"{name}: expected a finite number > 0; got {value!r}")
            object.__setattr__(self, name, float(value))

    def _check_family(self) -> None:
        """The seed's positional family's fields, checked whatever the encoding (as rope_base is)."""
        for name in ("bam_learn_mu", "use_ssmax"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}: expected True or False; got {getattr(self, name)!r}")
        for name, minimum in (("sinusoidal_max_len", 1), ("pape_num_parabolas", 1), ("pape_num_positions", 1),
                              ("layer_idx", 0)):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name), minimum))
        for name, minimum, strict in (("sinusoidal_base", 0.0, True), ("sinusoidal_scale", 0.0, True),
                                      ("hope_base", 0.0, True), ("hope_damping", 0.0, False), ("bam_eps", 0.0, True),
                                      ("ssmax_s_init", 0.0, True), ("alibi_scale", 0.0, True), ("bam_theta_init", None, False),
                                      ("bam_mu_init", None, False)):
            object.__setattr__(self, name, _real(name, getattr(self, name), minimum=minimum, strict=strict))
        _choice("ssmax_length", self.ssmax_length, SSMAX_LENGTHS)
        if self.position_encoding in ("pape", "pape_efficient") and self.pape_num_positions != 1:
            raise ValueError(
                f"pape_num_positions: {self.positional_encoding} takes one position coordinate, expected 1 "
                f"(the seed's ODE path crashes on more; pape_ri takes any n >= 1 as its factor); "
                f"got {self.pape_num_positions}"
            )

    @property
    def ssmax(self) -> bool:
        """SSMax in effect: use_ssmax with ode_use_pe on (it belongs to the seed's encoder object)."""
        return self.use_ssmax and self.ode_use_pe

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def position_encoding(self) -> str:
        """The encoding in effect: positional_encoding when ode_use_pe is on, else "none"; the
        four null encodings (NULL_ENCODINGS) are all "none" inside f."""
        if not self.ode_use_pe or self.positional_encoding in NULL_ENCODINGS:
            return "none"
        return self.positional_encoding

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_any(cls, obj: Any) -> "ODEConfig":
        """An ODEConfig from an ODEConfig, a dict, or any object with the fields as attributes.

        A dict must hold only field names (an unknown key is refused, it is likely a typo); an
        object (the seed's config classes) is read by attribute and may carry other attributes.
        A missing ``hidden_size`` or ``num_heads`` is an error; other missing fields take the
        defaults above.
        """
        if isinstance(obj, cls):
            return obj
        return cls(**field_values(cls, obj, ("hidden_size", "num_heads")))
