"""ODEEncoderConfig: the ODE Transformer's encoder, whose RK blocks take a whole encoder layer as F.

The fields carry the released encoder's argument names (encoder_embed_dim, ..., enc_calculate_num,
rk_type), so a released model's arguments convert with ``ODEEncoderConfig.from_any(args)``. Two
fields are odeattn's: ``family``, one name for the pair (enc_calculate_num, rk_type), and
``profile``, which says what a stage value is:

    family         enc_calculate_num  rk_type           the block (paper profile, F = L(y) - y)
    euler          1                  standard          y + F1                  (the plain layer)
    rk2            2                  standard          y + (F1 + F2) / 2       (Heun)
    rk3            3                  standard          y + (F1 + 4 F2 + F3) / 6 (Kutta's third order)
    rk4            4                  standard          y + (F1 + 2 F2 + 2 F3 + F4) / 6 (classical)
    rk2_gated      2                  learnable         y + g F1 + (1 - g) F2, g = sigmoid(gate_linear([F1; F2]))
    rk2_weighted   2                  initialization    y + alpha[0] F1 + alpha[1] F2, alpha initialised to 1

    profile "paper" (default): the stages are F = L(y) - y, the paper's formulas.
    profile "released": the stages are the layer's output L(y) and each formula is the released
        code's, RK3's stage inputs included (encoder_block.py). The released forward writes out
        rk2, rk3, rk4, rk2_gated and rk2_weighted; its constructor builds only rk2_gated and
        rk2_weighted. All five are allowed here (their arithmetic is the forward's); euler is
        refused under "released": the released code has no one-stage RK block (its plain layer
        is euler under "paper").
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass
from typing import Any

import numpy as np

from .config import field_values

# family -> (enc_calculate_num, rk_type)
FAMILIES: dict[str, tuple[int, str]] = {
    "euler": (1, "standard"),
    "rk2": (2, "standard"),
    "rk3": (3, "standard"),
    "rk4": (4, "standard"),
    "rk2_gated": (2, "learnable"),
    "rk2_weighted": (2, "initialization"),
}
PROFILES: tuple[str, ...] = ("paper", "released")
RELEASED_FAMILIES: tuple[str, ...] = ("rk2", "rk3", "rk4", "rk2_gated", "rk2_weighted")  # the released forward's formulas
RELEASED_BUILDS: tuple[str, ...] = ("rk2_gated", "rk2_weighted")  # what the released constructor accepts


def _pairs(families) -> str:
    return ", ".join(f"{name} = ({FAMILIES[name][0]}, {FAMILIES[name][1]!r})" for name in families)


def family_of(enc_calculate_num, rk_type) -> str:
    """The family of a (enc_calculate_num, rk_type) pair; ValueError listing the pairs otherwise."""
    for name, pair in FAMILIES.items():
        if pair == (enc_calculate_num, rk_type):
            return name
    raise ValueError(f"enc_calculate_num, rk_type: expected one of the pairs {_pairs(FAMILIES)}; "
                     f"got ({enc_calculate_num!r}, {rk_type!r})")


def _int_at_least(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field}: expected an integer >= {minimum}; got {value!r}")
    return int(value)


def _probability(field: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not 0.0 <= value < 1.0:
        raise ValueError(f"{field}: expected a number in [0, 1); got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ODEEncoderConfig:
    encoder_embed_dim: int  # C, the width of every token state
    encoder_attention_heads: int  # heads; head_dim = C // heads must be exact
    encoder_ffn_embed_dim: int  # the FFN's inner width (ffn_dim)
    encoder_layers: int = 1  # RK blocks in the stack, each with its own layer
    encoder_normalize_before: bool = False  # pre-norm; False is post-norm, fairseq's default
    enc_calculate_num: int | None = None  # stages per block; None: from family
    rk_type: str | None = None  # "standard", "learnable" or "initialization"; None: from family
    family: str | None = None  # a name for the pair above (FAMILIES); None: from the pair, else "euler"
    profile: str = "paper"  # "paper" (stages F = L(y) - y) or "released" (stages L(y))
    # training only, as released: the spec is evaluation, a port draws them anew at every stage
    dropout: float = 0.0  # after the attention and after fc2
    attention_dropout: float = 0.0  # on the attention weights
    activation_dropout: float = 0.0  # after the ReLU

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("encoder_embed_dim", _int_at_least("encoder_embed_dim", self.encoder_embed_dim, 1))
        set_("encoder_attention_heads", _int_at_least("encoder_attention_heads", self.encoder_attention_heads, 1))
        set_("encoder_ffn_embed_dim", _int_at_least("encoder_ffn_embed_dim", self.encoder_ffn_embed_dim, 1))
        set_("encoder_layers", _int_at_least("encoder_layers", self.encoder_layers, 1))
        if self.encoder_embed_dim % self.encoder_attention_heads:
            raise ValueError(f"encoder_embed_dim: expected a multiple of encoder_attention_heads="
                             f"{self.encoder_attention_heads}; got {self.encoder_embed_dim}")
        if isinstance(self.encoder_normalize_before, np.bool_):
            set_("encoder_normalize_before", bool(self.encoder_normalize_before))
        if not isinstance(self.encoder_normalize_before, bool):
            raise ValueError(f"encoder_normalize_before: expected True or False; got {self.encoder_normalize_before!r}")
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            set_(name, _probability(name, getattr(self, name)))
        self._resolve_family()
        if self.profile not in PROFILES:
            raise ValueError(f"profile: expected one of {', '.join(map(repr, PROFILES))}; got {self.profile!r}")
        if self.profile == "released" and self.family not in RELEASED_FAMILIES:
            raise ValueError(
                f"family: the released profile has no {self.family!r} block; it writes {_pairs(RELEASED_FAMILIES)} "
                f"(its constructor builds only {' and '.join(RELEASED_BUILDS)}); {self.family} is profile 'paper'")

    def _resolve_family(self) -> None:
        """Fill family from the pair, or the pair from family; refuse a pair and family that disagree."""
        pair_given = self.enc_calculate_num is not None or self.rk_type is not None
        if self.family is None:
            family = family_of(self.enc_calculate_num, self.rk_type) if pair_given else "euler"
        elif self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {', '.join(map(repr, FAMILIES))}; got {self.family!r}")
        else:
            family = self.family
            if pair_given and (self.enc_calculate_num, self.rk_type) != FAMILIES[family]:
                raise ValueError(f"family: {family!r} is (enc_calculate_num, rk_type) = {FAMILIES[family]}; "
                                 f"got ({self.enc_calculate_num!r}, {self.rk_type!r}) beside it")
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "enc_calculate_num", FAMILIES[family][0])
        object.__setattr__(self, "rk_type", FAMILIES[family][1])

    @property
    def head_dim(self) -> int:
        return self.encoder_embed_dim // self.encoder_attention_heads

    @property
    def scale(self) -> float:
        """q's factor, head_dim ** -0.5, applied after the input projection's bias."""
        return self.head_dim**-0.5

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_any(cls, obj: Any) -> "ODEEncoderConfig":
        """From an ODEEncoderConfig, a dict of field names (an unknown key is refused), or any object
        with the fields as attributes (a released model's args; other attributes are ignored)."""
        if isinstance(obj, cls):
            return obj
        return cls(**field_values(cls, obj, ("encoder_embed_dim", "encoder_attention_heads", "encoder_ffn_embed_dim")))
