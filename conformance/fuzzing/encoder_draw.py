"""The encoder stack's draws (`odeattn conformance fuzz --encoder-examples N`): ODEEncoderConfig over
every family and profile, both norm placements, the Macaron layer under both halves, PCformer's
alpha (scalar, per layer, per channel) and corrector, and qkvflow's time-dependent stack, each at a
shape, padding and input of its own, judged against the spec by the golden encoder cases' rule
(kinds.ENCODER: the spec's own float32 error sets the tolerance).

Each choice is ordered from simple to complex, as draw.py's (euler before rk4_ema, no padding first,
offset 0 first), so that hypothesis shrinks a failure toward the simplest stack that still fails;
essence.py then resets each field it can. The sizes stay small, as the golden rows' do: the spec
runs layers x stages layer evaluations in Python, and JAX compiles each config (the config static).
Every row keeps a real token (the stack refuses a sequence of none).
"""

from __future__ import annotations

from hypothesis import strategies as st

import ode_ref as R
from ode_ref.encoder_config import ALL_FAMILIES, ALPHA_TYPES, EMA_FAMILIES, MACARON_PROFILES, RELEASED_FAMILIES

from ..cases.kinds import ENCODER
from . import draw as D
from .draw import OFFSETS, ROW_PADDING, SCALES, Draw

FAMILIES = tuple(ALL_FAMILIES)  # euler first: the plain layer
SEQS = tuple(t for t in D.SEQS if t <= 33)  # the block draws' lengths around 16 and 32
HEADS = (1, 2, 3, 4)
HEAD_DIMS = (4, 1, 2, 3, 5, 8, 16)
LAYERS = (1, 2, 3)  # blocks, or a time-dependent stack's Euler steps
PADDING = tuple(k for k in ROW_PADDING if k != "full")  # a sequence of no real token is refused


@st.composite
def encoder_draws(draw) -> Draw:
    """A Draw of kind encoder (module docstring)."""
    family = draw(st.sampled_from(FAMILIES))
    fields = {"family": family}
    if family == "euler" and draw(st.booleans()):  # qkvflow's stack: euler, pre-norm, no successor's field
        fields.update(time_embed_dim=draw(st.integers(1, 8)), sinusoidal_dim=draw(st.sampled_from((16, 2, 4, 8))),
                      encoder_normalize_before=True)
    else:
        fields.update(profile=draw(st.sampled_from(R.PROFILES)) if family in RELEASED_FAMILIES else "paper",
                      encoder_normalize_before=draw(st.booleans()), macaron=draw(st.booleans()))
        if fields["macaron"]:
            fields["macaron_profile"] = draw(st.sampled_from(MACARON_PROFILES))
        if family in EMA_FAMILIES and family != "rk3_ema":  # rk3_ema's alpha is one scalar, as released
            fields["alpha_type"] = draw(st.sampled_from(ALPHA_TYPES))
            fields["layer_wise"] = fields["alpha_type"] == "scalar" and draw(st.booleans())
        if draw(st.booleans()):
            fields["encoder_history_type"] = R.CORRECTOR
    heads, head_dim = draw(st.sampled_from(HEADS)), draw(st.sampled_from(HEAD_DIMS))
    width = heads * head_dim
    ffn = draw(st.sampled_from((2 * width, 1, width, 4 * width)))
    seq, batch = draw(st.sampled_from(SEQS)), draw(st.integers(1, 4))
    rows = None
    if draw(st.booleans()):
        rows = tuple((draw(st.sampled_from(PADDING)), draw(st.integers(1, max(1, seq - 1)))) for _ in range(batch))
    config = R.ODEEncoderConfig(width, heads, ffn, encoder_layers=draw(st.sampled_from(LAYERS)), **fields)
    return Draw(ENCODER, config, batch, seq, rows, draw(st.sampled_from(SCALES)), draw(st.sampled_from(OFFSETS)),
                draw(st.integers(0, 2**16)), draw(st.integers(0, 2**16)))
