"""Cached decoding in ONNX Runtime: the prefill and decode-step models behind one cache API.

The decode-step model's feeds are x_t [batch, 1, d_model], index (int64 scalar: the slot the
token goes to) and the past cache, named as decode_names says; its outputs are z and the present
cache under the matching names. OnnxDecoder wires those names once, for every caller (the
conformance adapter, `odeattn run` and the bench).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

import ode_ref as R

from .block import decode_names

Run = Callable[[dict], dict]  # a feed -> every output of one model, by name


class OnnxCache(NamedTuple):
    """An ONNX Runtime cache: the arrays of the decode-step model's past inputs, in decode_names
    order (keys of every evaluation, values of every evaluation, padding mask), and the next slot."""

    arrays: tuple
    index: int

    @classmethod
    def from_spec(cls, cache: R.KVCache) -> "OnnxCache":
        """The spec's KVCache as the exported models' feeds (float32)."""
        arrays = [np.asarray(a, np.float32) for a in (*cache.k, *cache.v)] + [np.asarray(cache.padding_mask, bool)]
        return cls(tuple(arrays), int(cache.index))


def session_runner(model, *, threads: int | None = None) -> Run:
    """A Run over an onnxruntime session of `model` (a ModelProto or a path)."""
    from .runtime import session

    sess = session(model, threads=threads)
    names = [o.name for o in sess.get_outputs()]
    return lambda feed: dict(zip(names, sess.run(names, feed)))


class OnnxDecoder:
    """prefill and decode_step over the exported models, with the spec's cache semantics.

    config: the block's ODEConfig (decoder mode); prefill_run, decode_run: a Run for the prefill
    and decode-step models (either may be None when a caller needs only the other).
    """

    def __init__(self, config, prefill_run: Run | None = None, decode_run: Run | None = None):
        self.config = R.ODEConfig.from_any(config)
        self.past, self.present = decode_names(self.config)
        self.prefill_run, self.decode_run = prefill_run, decode_run

    @classmethod
    def from_models(cls, config, prefill_model=None, decode_model=None, *, threads: int | None = None) -> "OnnxDecoder":
        """Sessions of the given models (ModelProto or path; None: that half is not built)."""
        return cls(config, None if prefill_model is None else session_runner(prefill_model, threads=threads),
                   None if decode_model is None else session_runner(decode_model, threads=threads))

    def empty(self, batch: int, max_len: int) -> OnnxCache:
        """A cache of max_len unwritten slots: zero keys and values, every slot padded."""
        cfg = self.config
        kv = np.zeros((batch, max_len, cfg.num_heads, cfg.head_dim), np.float32)
        return OnnxCache((kv,) * (len(self.past) - 1) + (np.zeros((batch, max_len), bool),), 0)

    def prefill(self, x, padding_mask=None, max_len: int | None = None):
        """(z [batch, seq, d_model], the cache of max_len slots, default seq) for the prompt x."""
        batch, seq = x.shape[:2]
        mask = np.ones((batch, seq), bool) if padding_mask is None else padding_mask
        out = self.prefill_run({"x": x, "padding_mask": mask, "max_len": np.array(seq if max_len is None else max_len, np.int64)})
        return out["z"], OnnxCache(tuple(out[n] for n in self.present), seq)

    def step_feed(self, x_t, cache: OnnxCache) -> dict:
        """The decode-step model's feed for token x_t [batch, 1, d_model] at slot cache.index."""
        return {"x_t": x_t, "index": np.array(cache.index, np.int64), **dict(zip(self.past, cache.arrays))}

    def decode_step(self, x_t, cache: OnnxCache):
        """(z_t [batch, 1, d_model], the cache with x_t appended); the given cache is not changed."""
        out = self.decode_run(self.step_feed(x_t, cache))
        return out["z"], OnnxCache(tuple(out[n] for n in self.present), cache.index + 1)

    def generate(self, x):
        """Every token of x [batch, seq, d_model] decoded one by one from an empty cache of seq slots."""
        cache, out = self.empty(x.shape[0], x.shape[1]), []
        for i in range(x.shape[1]):
            z, cache = self.decode_step(x[:, i:i + 1], cache)
            out.append(z)
        return np.concatenate(out, axis=1)
