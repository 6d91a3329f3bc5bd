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

The Macaron layer (Lu et al. 2019, arXiv 1906.02762; macaron-net's ``--macaron``) puts a second FFN
of its own weights before the attention: x1 = x + 1/2 FFN_a(LN2 x), x2 = x1 + Attn(LN0 x1),
x3 = x2 + 1/2 FFN_b(LN1 x2) pre-norm (each sublayer norm-after under post-norm), a Strang-like
splitting of dz/dt = Attn(z) + FFN(z). ``macaron_profile`` says whose halves:

    "paper"      1/2 on both FFNs: the paper, and macaron-net's released layer (fc_factor 0.5)
    "released"   1/2 on FFN_a alone: the ODE Transformer's copy (macaron_transformer.py), whose
                 second FFN adds whole

It is the encoder's layer L, so every family and profile above runs over it.

PCformer (Li et al., NeurIPS 2024, arXiv 2411.03042; its NMT code's encoder) adds a predictor and a
corrector (encoder.py writes both out):

    family    enc_calculate_num  rk_type  the predictor (released profile, k_i = L(Y_i))
    rk2_ema   2                  ema      P = y + a(1-a) k_1 + a k_2              Heun's stages
    rk3_ema   3                  ema      P = y + a(1-a)^2 k_1 + a(1-a) k_2 + a k_3   Kutta's stages
    rk4_ema   4                  ema      P = y + a(1-a)^3 k_1 + ... + a k_4       classical RK4's stages

    a = alpha, learnt, initialised to 1/2: one scalar (alpha_type "scalar"), one per layer
    (layer_wise), or one per channel (alpha_type "vector"). The released code gives its 3-stage
    predictor one scalar whatever those say: rk3_ema takes their defaults only. The weights do not
    sum to 1 (0.75 and 0.9375 at a = 1/2): this is a weighted combination of its own, not a
    consistent RK tableau. Its code's enc_learnable_type is rk_type here ("ema"; its "gated" is
    "learnable", rk2_gated; another value "standard"): from_any reads it from PCformer's args.

    encoder_history_type "rk_predicotor_multistep_corrector" (the released spelling): the corrector
    across layers, a history of states with learnt lower-triangular weights (encoder.py), after any
    family's block. None (the default): the blocks alone, as the ODE Transformer stacks them.
    PCformer's NMT forward always runs its history and refuses a one-stage predictor; here an ema
    family runs without the corrector too, and euler (the plain layer) with it.

Time-dependent weights (Tong et al., ICLR 2025, arXiv 2503.01329; SDML-KU/qkvflow's
NeuralOdeTransformer): time_embed_dim > 0 makes the stack one block shared by every step, whose
linear layers and norms take their weights from the time t (temporal.py):

    z_{k+1} = z_k + h [Attn_t(LN_t z_k) + MLP_t(LN_t z_k)],   t = (k + 1) h,  h = 1 / encoder_layers

then the final norm ln_f. encoder_layers counts its steps (the same weights run at any count),
encoder_ffn_embed_dim is the MLP's width, time_embed_dim and sinusoidal_dim are qkvflow's
time_embed_dim and sinusodial_dim. Its attention is causal (the released model is a GPT-2 language
model) and its norms pre-norm, so it takes family "euler", profile "paper" and
encoder_normalize_before=True, and none of the fields above; it drops (dropout) only after the
attention and after the MLP, so attention_dropout and activation_dropout stay 0. sinusoidal_dim is checked always and
read only with time_embed_dim > 0 (as rope_base is read with rotary positions only).
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
MACARON_PROFILES: tuple[str, ...] = ("paper", "released")  # the Macaron layer's halves (module docstring)
EMA_FAMILIES: dict[str, tuple[int, str]] = {"rk2_ema": (2, "ema"), "rk3_ema": (3, "ema"), "rk4_ema": (4, "ema")}  # PCformer's
ALL_FAMILIES: dict[str, tuple[int, str]] = {**FAMILIES, **EMA_FAMILIES}
ALPHA_TYPES: tuple[str, ...] = ("scalar", "vector")
# PCformer's enc_learnable_type -> rk_type: its "ema" weights, its "gated" rk2 (the ODE Transformer's
# learnable one); any other value runs the constant RK weights (its forward's else branch)
LEARNABLE_TYPES = {"ema": "ema", "gated": "learnable"}
CORRECTOR = "rk_predicotor_multistep_corrector"  # PCformer's encoder_history_type, spelt as released
# What qkvflow's block holds (time_embed_dim > 0): Euler steps, pre-norm, no successor's field
TEMPORAL_HOLDS = {"family": "euler", "profile": "paper", "encoder_normalize_before": True, "macaron": False,
                  "encoder_history_type": None,  # euler refuses alpha_type and layer_wise already
                  "attention_dropout": 0.0, "activation_dropout": 0.0}  # its attention and MLP drop nothing inside
RELEASED_FAMILIES: tuple[str, ...] = ("rk2", "rk3", "rk4", "rk2_gated", "rk2_weighted", *EMA_FAMILIES)  # the released forwards' formulas
RELEASED_BUILDS: tuple[str, ...] = ("rk2_gated", "rk2_weighted", *EMA_FAMILIES)  # what the released constructors build


def _pairs(families) -> str:
    return ", ".join(f"{name} = ({ALL_FAMILIES[name][0]}, {ALL_FAMILIES[name][1]!r})" for name in families)


def family_of(enc_calculate_num, rk_type) -> str:
    """The family of a (enc_calculate_num, rk_type) pair; ValueError listing the pairs otherwise."""
    for name, pair in ALL_FAMILIES.items():
        if pair == (enc_calculate_num, rk_type):
            return name
    raise ValueError(f"enc_calculate_num, rk_type: expected one of the pairs {_pairs(ALL_FAMILIES)}; "
                     f"got ({enc_calculate_num!r}, {rk_type!r})")


def _int_at_least(field: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{field}: expected an integer >= {minimum}; got {value!r}")
    return int(value)


def _flag(field: str, value: Any, also: str = "") -> bool:
    """value as a bool (NumPy's too, read from a checkpoint's args); ValueError naming the field otherwise."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{field}: expected True or False{also}; got {value!r}")
    return bool(value)


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
    macaron: bool = False  # the Macaron layer (macaron-net's argument; its "new" reads as True)
    macaron_profile: str = "paper"  # "paper" (1/2 on both FFNs) or "released" (the ODE Transformer's copy)
    alpha_type: str = "scalar"  # an ema family's alpha: "scalar" or "vector" (one per channel)
    layer_wise: bool = False  # a scalar alpha per layer, not one for the stack
    encoder_history_type: str | None = None  # PCformer's corrector (CORRECTOR), or None
    time_embed_dim: int = 0  # qkvflow's time-dependent weights: the embedding MLPs' width; 0: static weights
    sinusoidal_dim: int = 16  # qkvflow's sinusodial_dim: e(t) holds t and this many sines and cosines (even)
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
        set_("encoder_normalize_before", _flag("encoder_normalize_before", self.encoder_normalize_before))
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            set_(name, _probability(name, getattr(self, name)))
        self._resolve_family()
        self._check_macaron()
        self._check_pcformer()
        self._check_temporal()
        if self.profile not in PROFILES:
            raise ValueError(f"profile: expected one of {', '.join(map(repr, PROFILES))}; got {self.profile!r}")
        if self.profile == "released" and self.family not in RELEASED_FAMILIES:
            raise ValueError(
                f"family: the released profile has no {self.family!r} block; it writes {_pairs(RELEASED_FAMILIES)} "
                f"(the constructors build {', '.join(RELEASED_BUILDS)}); {self.family} is profile 'paper'")

    def _check_macaron(self) -> None:
        """macaron a bool (macaron-net's "new", the value its WMT architectures set, is True), and
        macaron_profile one of MACARON_PROFILES, its "released" only for a Macaron layer."""
        object.__setattr__(self, "macaron", _flag("macaron", True if self.macaron == "new" else self.macaron,
                                                  " (or macaron-net's 'new', read as True)"))
        if self.macaron_profile not in MACARON_PROFILES:
            raise ValueError(f"macaron_profile: expected one of {', '.join(map(repr, MACARON_PROFILES))}; "
                             f"got {self.macaron_profile!r}")
        if self.macaron_profile != "paper" and not self.macaron:
            raise ValueError(f"macaron_profile: {self.macaron_profile!r} sets a Macaron layer's halves; "
                             "got macaron=False (the layer has no Macaron FFN)")

    def _check_pcformer(self) -> None:
        """alpha_type and layer_wise set an ema family's alpha (rk3_ema's is one scalar, as released);
        encoder_history_type is None or PCformer's corrector."""
        object.__setattr__(self, "layer_wise", _flag("layer_wise", self.layer_wise))
        if self.alpha_type not in ALPHA_TYPES:
            raise ValueError(f"alpha_type: expected one of {', '.join(map(repr, ALPHA_TYPES))}; got {self.alpha_type!r}")
        if self.alpha_type == "vector" and self.layer_wise:
            raise ValueError("layer_wise: True sets a scalar alpha per layer; got alpha_type='vector' beside it "
                             "(the released constructor reads layer_wise for a scalar alpha only)")
        if (self.alpha_type, self.layer_wise) != ("scalar", False) and self.family not in EMA_FAMILIES:
            raise ValueError(f"alpha_type, layer_wise: set an ema family's alpha ({', '.join(EMA_FAMILIES)}); "
                             f"got ({self.alpha_type!r}, {self.layer_wise}) with family {self.family!r}")
        if (self.alpha_type, self.layer_wise) != ("scalar", False) and self.family == "rk3_ema":
            raise ValueError(f"alpha_type, layer_wise: rk3_ema's alpha is one scalar, as released; "
                             f"got ({self.alpha_type!r}, {self.layer_wise})")
        if self.encoder_history_type not in (None, CORRECTOR):
            raise ValueError(f"encoder_history_type: expected None or {CORRECTOR!r} (PCformer's corrector, "
                             f"spelt as released); got {self.encoder_history_type!r}")

    def _check_temporal(self) -> None:
        """time_embed_dim >= 0 and sinusoidal_dim even and >= 2, always; with time_embed_dim > 0 the
        stack is qkvflow's (module docstring), which takes the other fields at the values it holds."""
        object.__setattr__(self, "time_embed_dim", _int_at_least("time_embed_dim", self.time_embed_dim, 0))
        object.__setattr__(self, "sinusoidal_dim", _int_at_least("sinusoidal_dim", self.sinusoidal_dim, 2))
        if self.sinusoidal_dim % 2:
            raise ValueError(f"sinusoidal_dim: expected an even integer (qkvflow's SinusoidalPosEmb asserts it); "
                             f"got {self.sinusoidal_dim}")
        if not self.temporal:
            return
        for name, held in TEMPORAL_HOLDS.items():
            if getattr(self, name) != held:
                raise ValueError(f"{name}: qkvflow's time-dependent block (time_embed_dim={self.time_embed_dim}) takes "
                                 f"{name}={held!r}; got {getattr(self, name)!r}")

    @property
    def temporal(self) -> bool:
        """Whether the stack is qkvflow's, its weights functions of t (time_embed_dim > 0)."""
        return self.time_embed_dim > 0

    @property
    def corrector(self) -> bool:
        """Whether PCformer's corrector follows each block."""
        return self.encoder_history_type == CORRECTOR

    @property
    def ffn_factors(self) -> tuple[float, float]:
        """(FFN_a's factor, FFN_b's): the Macaron layer's halves by macaron_profile; (1, 1) otherwise
        (FFN_a absent)."""
        if not self.macaron:
            return 1.0, 1.0
        return 0.5, 0.5 if self.macaron_profile == "paper" else 1.0

    def _resolve_family(self) -> None:
        """Fill family from the pair, or the pair from family; refuse a pair and family that disagree."""
        pair_given = self.enc_calculate_num is not None or self.rk_type is not None
        if self.family is None:
            family = family_of(self.enc_calculate_num, self.rk_type) if pair_given else "euler"
        elif self.family not in ALL_FAMILIES:
            raise ValueError(f"family: expected one of {', '.join(map(repr, ALL_FAMILIES))}; got {self.family!r}")
        else:
            family = self.family
            if pair_given and (self.enc_calculate_num, self.rk_type) != ALL_FAMILIES[family]:
                raise ValueError(f"family: {family!r} is (enc_calculate_num, rk_type) = {ALL_FAMILIES[family]}; "
                                 f"got ({self.enc_calculate_num!r}, {self.rk_type!r}) beside it")
        object.__setattr__(self, "family", family)
        object.__setattr__(self, "enc_calculate_num", ALL_FAMILIES[family][0])
        object.__setattr__(self, "rk_type", ALL_FAMILIES[family][1])

    @property
    def head_dim(self) -> int:
        return self.encoder_embed_dim // self.encoder_attention_heads

    @property
    def hidden_size(self) -> int:
        """encoder_embed_dim under ODEConfig's name, so that code reading a case's shape reads either config."""
        return self.encoder_embed_dim

    @property
    def num_heads(self) -> int:
        """encoder_attention_heads under ODEConfig's name (as hidden_size)."""
        return self.encoder_attention_heads

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
        values = field_values(cls, obj, ("encoder_embed_dim", "encoder_attention_heads", "encoder_ffn_embed_dim"))
        learnable = getattr(obj, "enc_learnable_type", None) if not isinstance(obj, dict) else None
        if learnable is not None and values.get("rk_type") is None:  # PCformer's args name rk_type so
            values["rk_type"] = LEARNABLE_TYPES.get(learnable, "standard")
        return cls(**values)
