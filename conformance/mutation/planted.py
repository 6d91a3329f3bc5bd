"""Ports with a planted kernel bug, each exact inside the golden set's shapes (batch <= 3, seq <= 9,
head_dim <= 10, inputs near N(0, 1)) and wrong outside them, where real kernels switch paths.
The golden cases before the kernel-boundary tier (cases.TIER_CASES) pass every one, and each but
WideRotary fails a case of the tier (tests/conformance/test_golden.py); `odeattn conformance fuzz`
must catch the first five at its default budget and seed, shrink them, and localise them
(tests/conformance/test_fuzz.py), and catch those of TRIGGERS in a covering array's row at every
seed from 0 to 19 (tests/conformance/test_fuzz_cover.py).

    TileBoundary      queries past the first tile of 16 skip the last key of the tile before
    BatchChunk        batch rows past the first chunk of 4 read the keys and values of row b - 4
    HeadWidthFastPath at head_dim a multiple of 16 from 32, the last 16 lanes of attn's output
                      read the first 16
    PositionTable     the query's rotation read from a table of 32 positions, clamped past it
    OffsetInput       layer_norm's variance in one pass, E[x^2] - E[x]^2: exact near zero, lost
                      to cancellation on inputs offset far from it

Seven more, each on two factors together or on an axis the fuzzer once never drew, where a kernel
switches paths (PAIRED; TRIGGERS gives the pair of factor levels, cover.py, whose rows' examples
meet the bug, so the covering array, which holds every pair at every seed, reaches it by
construction; an example drawn there can still miss it: a norm saturated, the prompt all padded):

    WideSolver        a 4-stage solver at head_dim past 64: the last stage's slope read as zero
    HolesLongSeq      a row with holes, past 32 keys: its keys taken as the span from its first
                      real token to its last (a varlen path that assumes no holes)
    GridWave          a persistent grid of 16 (row, head) programs missing its work loop: the
                      pairs past the first wave left at zero
    WideRotary        RoPE at head_dim 48 and wider rotates halves (lane i with i + head_dim/2),
                      not the spec's interleaved pairs
    LongKeys          past 128 keys, a split-K softmax: the second split's sums not rescaled to
                      the first's running max
    DecodePage        the ninth decoded token and each after it written one slot early, over the
                      token before (a page table's off-by-one at its page of 8)
    DecodeSteps       a decode cache laid out for 4 steps: a fifth step's evaluations read the
                      first step's keys and values

Each is the spec with one stage overridden (as conformance/mutation/mutants.py's are): a SpecAdapter
whose `variant` is that SelfAttention subclass, run in float32 and float64:
`odeattn conformance fuzz --backend odeattn.conformance.mutation.planted:TileBoundary`.
"""

from __future__ import annotations

import itertools

import numpy as np

import ode_ref as R
from ode_ref.attention import masked_fill_min
from ode_ref.config import ROTARY_ENCODINGS
from ode_ref.norms import LAYER_NORM_EPS
from ode_ref.positions import apply_rope, rope_cos_sin
from ode_ref.rk import integrate
from ode_ref.tableaus import TABLEAUS

from ..adapters import SpecAdapter

TILE = 16
CHUNK = 4
LANES = 16
TABLE = 32
REGISTERS = 64  # WideSolver: the widest head whose four slopes stay in registers
SPAN_FROM = 32  # HolesLongSeq: the varlen path's shortest row
WAVE = 16  # GridWave: the programs of one wave
HALVES_FROM = 48  # WideRotary: the narrowest head rotated by halves
SPLIT = 128  # LongKeys: the keys of one split
PAGE = 8  # DecodePage: the cache's page of decoded tokens
CACHED_STEPS = 4  # DecodeSteps: the steps the cache's layout holds


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


class _WideSolver(R.SelfAttention):
    def integrate(self, prepared, x, kv=None, *, checkpoint=None, trajectory: bool = True):
        cfg = self.config
        stages = len(TABLEAUS[cfg.ode_solver].c) if cfg.ode_solver in TABLEAUS else 1  # a multistep solver: one a step
        if stages < 4 or cfg.head_dim <= REGISTERS:
            return super().integrate(prepared, x, kv, checkpoint=checkpoint, trajectory=trajectory)
        calls = itertools.count()

        def f(t, z):
            y = self.evaluate(prepared, t, z, kv)
            return y * 0 if next(calls) % stages == stages - 1 else y  # the last slope spilled and never stored

        return integrate(f, x, TABLEAUS[cfg.ode_solver], cfg.ode_steps, self.solution_gate(prepared),
                         checkpoint=checkpoint, trajectory=trajectory)


class _HolesLongSeq(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None, *, cache_index=None):
        if padding_mask is None or padding_mask.shape[1] <= SPAN_FROM:
            return super().build_mask(seq_len, padding_mask, cache_index=cache_index)
        real = np.asarray(padding_mask)
        slots = np.arange(real.shape[1])
        first, last = real.argmax(axis=1), real.shape[1] - 1 - real[:, ::-1].argmax(axis=1)
        span = (slots >= first[:, None]) & (slots <= last[:, None]) & real.any(axis=1)[:, None]  # the holes in it read as real
        return super().build_mask(seq_len, span, cache_index=cache_index)


class _GridWave(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        y = super().attn(q, k, v, mask, bias)
        b, t, h, d = y.shape
        if b * h <= WAVE:
            return y
        programs = y.transpose(0, 2, 1, 3).reshape(b * h, t, d)  # program p: row p // heads, head p % heads
        programs[WAVE:] = 0  # one wave ran; the work loop that would run the rest is missing
        return programs.reshape(b, h, t, d).transpose(0, 2, 1, 3)


class _WideRotary(R.SelfAttention):
    def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
        if rope is None or self.config.position_encoding != "rope" or self.config.head_dim < HALVES_FROM:
            return super().preprocess_qkv(q, k, v, t=t, positions=positions, rope=rope)
        cos, sin = rope
        pairs = cos.shape[-1]
        lanes = np.stack([np.arange(pairs), np.arange(pairs) + pairs], axis=-1).reshape(-1)  # lane i with i + pairs

        def halves(x):
            y = x.copy()
            y[..., lanes] = apply_rope(x[..., lanes], cos, sin)
            return y

        return halves(q), halves(k), v


class _LongKeys(R.SelfAttention):
    def attn(self, q, k, v, mask, bias=None):
        if k.shape[1] <= SPLIT:
            return super().attn(q, k, v, mask, bias)
        q, k, v = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
        s = (q @ k.transpose(0, 1, 3, 2)) * q.dtype.type(self.config.scale)
        s = masked_fill_min(s if bias is None else s + bias, mask)
        visible = np.broadcast_to(mask, s.shape)
        num, den = 0, 0
        for keys in (slice(0, SPLIT), slice(SPLIT, None)):
            part = s[..., keys]
            e = np.where(visible[..., keys], np.exp(part - part.max(axis=-1, keepdims=True)), 0)  # its own max, never rescaled
            num, den = num + e @ v[:, :, keys], den + e.sum(axis=-1, keepdims=True)
        return (num / np.where(den > 0, den, 1)).transpose(0, 2, 1, 3)


class _DecodePage(R.SelfAttention):
    def prefill(self, params, x, padding_mask, max_len: int):
        self.prompt = self.seq_len(x)
        return super().prefill(params, x, padding_mask, max_len)

    def decode(self, params, x_t, cache):
        if cache.index - self.prompt < PAGE:
            return super().decode(params, x_t, cache)
        z, written = super().decode(params, x_t, cache._replace(index=cache.index - 1))  # the page's slot off by one
        return z, written._replace(index=cache.index + 1)


class _DecodeSteps(R.SelfAttention):
    def decode(self, params, x_t, cache):
        steps, n = self.config.ode_steps, len(cache.k)
        if steps <= CACHED_STEPS:
            return super().decode(params, x_t, cache)
        held = CACHED_STEPS * n // steps  # the evaluations the layout holds: a later step's read from the first's
        return super().decode(params, x_t, cache._replace(k=cache.k[:held] + cache.k[:n - held], v=cache.v[:held] + cache.v[:n - held]))


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
WideSolver = _planted("WideSolver", _WideSolver, "A 4-stage solver at head_dim past 64: the last stage's slope read as zero.")
HolesLongSeq = _planted("HolesLongSeq", _HolesLongSeq, "A row with holes past 32 keys: its keys taken as the span of its real ones.")
GridWave = _planted("GridWave", _GridWave, "A grid of 16 (row, head) programs run once: the pairs past it left at zero.")
WideRotary = _planted("WideRotary", _WideRotary, "RoPE at head_dim 48 and wider rotates halves, not interleaved pairs.")
LongKeys = _planted("LongKeys", _LongKeys, "Past 128 keys, a split-K softmax whose second split is not rescaled.")
DecodePage = _planted("DecodePage", _DecodePage, "The ninth decoded token and each after it written over the token before.")
DecodeSteps = _planted("DecodeSteps", _DecodeSteps, "A decode cache laid out for 4 steps: a fifth step's evaluations read the first's.")
Unplanted = _planted("Unplanted", R.SelfAttention, "No bug: the spec's own stages, through the planted ports' adapter.")
FIVE = (TileBoundary, BatchChunk, HeadWidthFastPath, PositionTable, OffsetInput)  # the kinds of bug the fuzzer was built against
PAIRED = (WideSolver, HolesLongSeq, GridWave, WideRotary, LongKeys, DecodePage, DecodeSteps)
PLANTED = FIVE + PAIRED
# port -> a pair of factor levels (cover.py) whose rows' examples meet its bug: the covering array
# holds each pair at every seed, so a default run reaches a row of it
TRIGGERS = {
    BatchChunk: (("batch", "5-9"), ("padding", "no mask")),  # row 4 reads row 0's keys
    HeadWidthFastPath: (("head_dim", "96-128"), ("padding", "no mask")),  # 96 and 128: multiples of 16 from 32
    WideSolver: (("ode_solver", "rk4"), ("head_dim", "96-128")),
    HolesLongSeq: (("padding", "holes"), ("seq", "63-65")),  # a decode draw's prompt too: 17 tokens at most decoded
    GridWave: (("heads", "5-16"), ("batch", "5-9")),  # 25 programs or more
    WideRotary: (("encoding", "rope"), ("head_dim", "48-65")),  # two real tokens: draw.positioned_rows
    LongKeys: (("seq", "255-257"), ("padding", "no mask")),  # queries past 128 see both splits
    DecodePage: (("kind", "decode"), ("decoded", "9-17")),
    DecodeSteps: (("kind", "decode"), ("steps", "5-9")),
}
