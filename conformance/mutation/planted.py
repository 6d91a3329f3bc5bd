"""Ports with a planted kernel bug, each exact inside the golden set's shapes (batch <= 3, seq <= 9,
head_dim <= 10, inputs near N(0, 1)) and wrong outside them, where real kernels switch paths.
The golden cases before the kernel-boundary tier (cases.TIER_CASES) pass every one, and each fails a
case of the tier (tests/conformance/test_golden.py); `odeattn conformance fuzz` must catch each at its default
budget and seed, shrink it, and localise it (tests/conformance/test_fuzz.py).

    TileBoundary      queries past the first tile of 16 skip the last key of the tile before
    BatchChunk        batch rows past the first chunk of 4 read the keys and values of row b - 4
    HeadWidthFastPath at head_dim a multiple of 16 from 32, the last 16 lanes of attn's output
                      read the first 16
    PositionTable     the query's rotation read from a table of 32 positions, clamped past it
    OffsetInput       layer_norm's variance in one pass, E[x^2] - E[x]^2: exact near zero, lost
                      to cancellation on inputs offset far from it

Each is the spec with one stage overridden (as conformance/mutation/mutants.py's are): a SpecAdapter
whose `variant` is that SelfAttention subclass, run in float32 and float64:
`odeattn conformance fuzz --backend odeattn.conformance.mutation.planted:TileBoundary`.
"""

from __future__ import annotations

import numpy as np

import ode_ref as R
from ode_ref.config import ROTARY_ENCODINGS
from ode_ref.norms import LAYER_NORM_EPS
from ode_ref.positions import apply_rope, rope_cos_sin

from ..adapters import SpecAdapter

TILE = 16
CHUNK = 4
LANES = 16
TABLE = 32


class _TileBoundary(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        if q.shape[1] <= TILE:
            return super().attn(q, k, v, mask, bias)
        mask = np.broadcast_to(mask, (q.shape[0], 1, q.shape[1], k.shape[1])).copy()
        mask[:, :, TILE:, TILE - 1] = False  # the second tile's key loop starts one key late
        return super().attn(q, k, v, mask, bias)


class _BatchChunk(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        if q.shape[0] <= CHUNK:
            return super().attn(q, k, v, mask, bias)
        k, v = k.copy(), v.copy()
        k[CHUNK:], v[CHUNK:] = k[:-CHUNK].copy(), v[:-CHUNK].copy()  # the chunk's offset not added to the k, v pointers
        return super().attn(q, k, v, mask, bias)


class _HeadWidthFastPath(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        y = super().attn(q, k, v, mask, bias)
        d = q.shape[-1]
        if d % LANES or d < 2 * LANES:
            return y
        y = y.copy()
        y[..., -LANES:] = y[..., :LANES]  # the last lane block stored from the first's registers
        return y


class _PositionTable(R.SelfAttention):
    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        q2, k2, v2 = super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        if rope is None or self.config.position_encoding not in ROTARY_ENCODINGS or positions.max() < TABLE:
            return q2, k2, v2
        cos, sin = rope_cos_sin(np.minimum(positions, TABLE - 1), self.config, q.dtype)  # the table runs out
        return apply_rope(q, cos, sin), k2, v2


class _OffsetInput(R.SelfAttention):
    def norm(self, norm_params, z):
        if self.config.norm_type != "layer_norm":
            return super().norm(norm_params, z)
        mean = z.mean(axis=-1, keepdims=True)
        var = (z * z).mean(axis=-1, keepdims=True) - mean * mean  # one pass: cancels when |mean| >> std
        return (z - mean) / np.sqrt(np.maximum(var, 0) + LAYER_NORM_EPS) * norm_params["weight"] + norm_params["bias"]


def _planted(name: str, stage: type, doc: str) -> type:
    return type(name, (SpecAdapter,), {"__doc__": doc, "name": f"planted-{name}", "dtypes": ("float32", "float64"),
                                       "variant": stage, "__module__": __name__,
                                       "run_vjp": None})  # the backward pass is the spec's own: nothing planted there


TileBoundary = _planted("TileBoundary", _TileBoundary, "Queries past the first tile of 16 skip the last key of the tile before.")
BatchChunk = _planted("BatchChunk", _BatchChunk, "Batch rows past the first chunk of 4 read the keys and values of row b - 4.")
HeadWidthFastPath = _planted("HeadWidthFastPath", _HeadWidthFastPath,
                             "At head_dim a multiple of 16 from 32, attn's last 16 lanes repeat the first 16.")
PositionTable = _planted("PositionTable", _PositionTable, "The query's rotation from a table of 32 positions, clamped past it.")
OffsetInput = _planted("OffsetInput", _OffsetInput, "layer_norm's variance in one pass, E[x^2] - E[x]^2.")
PLANTED = (TileBoundary, BatchChunk, HeadWidthFastPath, PositionTable, OffsetInput)
