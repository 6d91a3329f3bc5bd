"""A built conformance case (Case) and the helpers every case kind uses (kinds.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

import ode_ref as R
from ode_ref.precision import check_half_dtype

from .half import HALF_FIELDS


@dataclass(frozen=True)
class Case:
    """A built case: inputs, parameters and the spec's float64 outputs. Its kind (kinds.py) says
    what it checks and builds it (Kind.case); the rest of the suite asks the case, and the case
    its kind."""

    name: str
    config: R.ODEConfig  # an ODEEncoderConfig for an encoder case
    params: dict  # name -> float64 array
    x: np.ndarray  # float64 (batch, seq, d_model)
    padding_mask: Optional[np.ndarray]  # bool (batch, seq)
    f0: Optional[np.ndarray]  # f(0, x), float64 (block cases)
    trajectory: Optional[np.ndarray]  # (steps + 1, batch, seq, d_model); [0] = x, [-1] = z1 (block cases)
    e32: dict  # quantity -> the spec's own float32 relative error (z1: that of the last step)
    kind: object  # its kind: one of kinds.KINDS' values, which every behaviour below asks
    input_seed: int = 0  # the seed of the fair draw actually used
    param_seed: int = 0
    decoded: int = 0  # decode cases: tokens decoded after the prompt
    decode: Optional[np.ndarray] = None  # decode cases: (batch, seq, d_model), the prompt's z then each token's
    inputs: dict = field(default_factory=dict)  # its kind's inputs beside x (a grad case's z1_bar, the cotangent of z(1))
    outputs: Optional[dict] = None  # quantity -> float64 array, for the kinds that keep their golden so (grad:
    # x_bar and grad.<parameter>; encoder: z, the stack's output)
    e16: Optional[dict] = None  # quantity -> the spec's error under the half policy in float16 (half.py); None: untestable or not stored
    ebf16: Optional[dict] = None  # the same in bfloat16
    half_untestable: Optional[dict] = None  # dtype -> why the case has no meaning in it (half.py); None or {}: none

    def __post_init__(self):
        if not callable(getattr(self.kind, "missing_fields", None)):
            raise ValueError(f"case {self.name!r}: kind: expected a case kind (cases.kinds.KINDS' values); got {self.kind!r}")
        missing = self.kind.missing_fields(self)
        if missing:
            raise ValueError(f"case {self.name!r}: a {self.kind} case needs its {missing}; got None")

    @property
    def z1(self) -> np.ndarray:
        return self.trajectory[-1]

    @property
    def prompt(self) -> int:
        return self.x.shape[1] - self.decoded

    def quantities(self) -> dict:
        """name -> float64 golden array, in the order computed (Kind.quantities)."""
        return self.kind.quantities(self)

    def e32_of(self, quantity: str) -> float:
        """The spec's own float32 error of a quantity (z1 is the last step's state). z(0) is x, the
        input itself, computed by nothing: no e32 is stored for it and its tolerance is the floor,
        a few roundings of x to the backend's dtype."""
        if quantity == "step_0":
            return 0.0
        return self.e32[f"step_{self.config.ode_steps}" if quantity == "z1" else quantity]

    def untestable(self, dtype: str) -> Optional[str]:
        """Why the case has no meaning in dtype (float16 or bfloat16), or None: the stored reason
        (half.py's rules), or that the golden set stores no error for dtype (a team's own set)."""
        check_half_dtype(dtype)
        reason = (self.half_untestable or {}).get(dtype)
        if reason is None and getattr(self, HALF_FIELDS[dtype]) is None:
            return f"no {HALF_FIELDS[dtype]} in this golden set"
        return reason

    def e_half(self, dtype: str) -> dict:
        """quantity -> the spec's own error under the half policy in dtype, for every quantity of
        quantities() (z1: the last step's; step_0, x itself: 0, the tolerance's floor).
        ValueError if the case is untestable in dtype (untestable says why)."""
        reason = self.untestable(dtype)
        if reason is not None:
            raise ValueError(f"case {self.name!r} has no {HALF_FIELDS[dtype]}: {reason}")
        return self.kind.derived_errors(self, dict(getattr(self, HALF_FIELDS[dtype])))

    def split_outputs(self, outputs: dict) -> dict:
        """A backend's raw outputs as quantity -> array (Kind.split_outputs)."""
        return self.kind.split_outputs(self, outputs)


def fresh(params, x, padding_mask) -> tuple:
    """Copies of a call's inputs: each backend call gets its own, so writing into them changes nothing else."""
    return {k: v.copy() for k, v in params.items()}, x.copy(), None if padding_mask is None else padding_mask.copy()


def numbers(method: str, value) -> np.ndarray:
    """A backend's output as an array; TypeError naming the method if it holds no numbers (a str, a
    dict, a generator: NumPy makes them text or object arrays, which no reply can carry)."""
    a = np.asarray(value)
    if a.dtype.kind in "OSU":
        raise TypeError(f"{method}: expected an array of numbers; got {type(value).__name__}"
                        + (f" ({a.dtype})" if isinstance(value, np.ndarray) else ""))
    return a


def names_text(names) -> str:
    """A list of names for a defect: all of them up to 8, else the first three and the last."""
    names = list(names)
    return ", ".join(names) if len(names) <= 8 else f"{', '.join(names[:3])}, ..., {names[-1]} ({len(names)} quantities)"
