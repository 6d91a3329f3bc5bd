"""Cached decoding in ONNX Runtime: the prefill and decode-step models behind one cache API.

The decode-step model's feeds are x_t [batch, 1, d_model], index (int64 scalar: the slot the
token goes to) and the past cache, named as decode_names says; its outputs are z and the present
cache under the matching names. OnnxDecoder wires those names once, for every caller (the
conformance adapter, `odeattn run` and the bench), and checks every feed once for all of them:
its own inputs against the config, and (over a SessionRun) the whole feed against the model's
declared inputs, so a wrong input is refused by name before ONNX Runtime sees it.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

import ode_ref as R
from ode_ref.cache import check_cache_index

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


class SessionRun:
    """A Run over an onnxruntime session of `model` (a ModelProto or a path) whose every feed is
    checked against the model's declared inputs first (export.runtime.check_feed), so a wrong
    name, dtype or shape is one error naming the input, not ONNX Runtime's. The session is built
    by start() (session_runner starts it at once), or on the first run: check() can refuse a
    feed before that work."""

    def __init__(self, model, *, threads: int | None = None):
        import onnx

        from .runtime import declared_inputs, default_inputs

        self.model, self.threads = model, threads
        proto = model if isinstance(model, onnx.ModelProto) else onnx.load(model, load_external_data=False)
        self.declared, self.defaults = declared_inputs(proto), default_inputs(proto)
        self._sess = self._names = None

    def start(self) -> float:
        """Builds the session (once); the seconds that took."""
        import time

        from .runtime import session

        begun = time.perf_counter()
        if self._sess is None:
            self._sess = session(self.model, threads=self.threads)
            self._names = [o.name for o in self._sess.get_outputs()]
        return time.perf_counter() - begun

    def check(self, feed: dict) -> dict:
        from .runtime import check_feed

        return check_feed(self.declared, feed, self.defaults)

    def __call__(self, feed: dict) -> dict:
        return self.unchecked(self.check(feed))

    def unchecked(self, feed: dict) -> dict:
        """The run on a feed already checked (a loop whose first feed was checked, as generate's)."""
        from .runtime import run_session

        self.start()
        return dict(zip(self._names, run_session(self._sess, self._names, feed)))


def session_runner(model, *, threads: int | None = None) -> SessionRun:
    """A Run over an onnxruntime session of `model` (a ModelProto or a path), built now; its
    feeds are checked against the model's inputs (SessionRun)."""
    run = SessionRun(model, threads=threads)
    run.start()
    return run


def _checked(run, feed: dict) -> dict:
    """feed, checked by the run's own check (a SessionRun's: against its model's inputs) if it has one."""
    check = getattr(run, "check", None)
    return check(feed) if check is not None else feed


class OnnxDecoder:
    """prefill and decode_step over the exported models, with the spec's cache semantics.

    config: the block's ODEConfig (decoder mode); prefill_run, decode_run: a Run for the prefill
    and decode-step models (either may be None when a caller needs only the other). Every input
    is checked before a model runs: x and x_t float32 [batch, seq | 1, d_model], the prompt's
    padding_mask bool [batch, seq], max_len an integer >= seq, and (a SessionRun's) every feed
    against the model's declared inputs; TypeError or ValueError naming the input.
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

    def prefill_feed(self, x, padding_mask=None, max_len: int | None = None) -> dict:
        """The prefill model's feed for the prompt x, checked. No padding_mask: every token real
        (an all-True mask, unless the model was exported without that input)."""
        from .runtime import NO_MASK, check_mask, check_x

        x = check_x(x, self.config.hidden_size)
        batch, seq = x.shape[:2]
        if max_len is None:
            max_len = seq
        if isinstance(max_len, (bool, np.bool_)) or not isinstance(max_len, (int, np.integer)) or max_len < seq:
            raise ValueError(f"max_len: expected an integer >= the prompt's {seq} tokens; got {max_len!r}")
        feed = {"x": x, "max_len": np.array(max_len, np.int64)}
        takes_mask = "padding_mask" in getattr(self.prefill_run, "declared", {"padding_mask": None})
        if padding_mask is not None and not takes_mask:
            raise ValueError(NO_MASK)
        if takes_mask:
            feed["padding_mask"] = np.ones((batch, seq), bool) if padding_mask is None else check_mask(padding_mask, (batch, seq))
        return _checked(self.prefill_run, feed)

    def prefill(self, x, padding_mask=None, max_len: int | None = None):
        """(z [batch, seq, d_model], the cache of max_len slots, default seq) for the prompt x."""
        out = self.prefill_run(self.prefill_feed(x, padding_mask, max_len))
        return out["z"], OnnxCache(tuple(out[n] for n in self.present), int(np.shape(x)[1]))

    def step_feed(self, x_t, cache: OnnxCache) -> dict:
        """The decode-step model's feed for token x_t [batch, 1, d_model] at slot cache.index."""
        return {"x_t": x_t, "index": np.array(cache.index, np.int64), **dict(zip(self.past, cache.arrays))}

    def decode_step(self, x_t, cache: OnnxCache):
        """(z_t [batch, 1, d_model], the cache with x_t appended); the given cache is not changed.
        The cache is refused by name unless it is an OnnxCache with a valid slot index (the spec's
        check_cache_index: the graph would write no slot for an index out of range)."""
        from .runtime import check_x

        x_t = check_x(x_t, self.config.hidden_size, name="x_t", seq=1)
        if not isinstance(cache, OnnxCache):
            raise TypeError(f"cache: expected an ONNX Runtime cache from OnnxDecoder.prefill (an OnnxCache); "
                            f"got {type(cache).__name__}")
        cache = cache._replace(index=check_cache_index(cache.index, cache.arrays[-1].shape[1]))
        out = self.decode_run(self.step_feed(x_t, cache))  # a SessionRun checks the whole feed
        return out["z"], OnnxCache(tuple(out[n] for n in self.present), cache.index + 1)

    def check_generate(self, x) -> np.ndarray:
        """x checked for generate: float32 [batch, seq, d_model], and its first step's feed
        against the decode-step model's inputs (a SessionRun's), before anything runs."""
        from .runtime import check_x

        x = check_x(x, self.config.hidden_size)
        _checked(self.decode_run, self.step_feed(x[:, :1], self.empty(x.shape[0], x.shape[1])))
        return x

    def generate(self, x):
        """Every token of x [batch, seq, d_model] decoded one by one from an empty cache of seq slots."""
        x = self.check_generate(x)  # every later step's feed has the first one's names, shapes and dtypes
        run = getattr(self.decode_run, "unchecked", self.decode_run)
        cache, out = self.empty(x.shape[0], x.shape[1]), []
        for i in range(x.shape[1]):
            result = run(self.step_feed(x[:, i:i + 1], cache))
            cache = OnnxCache(tuple(result[n] for n in self.present), cache.index + 1)
            out.append(result["z"])
        return np.concatenate(out, axis=1)
