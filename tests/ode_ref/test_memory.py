"""ode_ref.memory: a call whose arrays cannot fit is refused from its shapes before it allocates,
with the estimate; the limit is ODEATTN_MEMORY_LIMIT or the machine's physical memory; and the
spec's estimate is held to the spec's measured peak."""

import os
import tracemalloc

import numpy as np
import pytest

import ode_ref as R
from ode_ref.memory import LIMIT_VARIABLE, MemoryLimitError, check_memory, memory_limit, scores_needs

LONG = 65_536  # the context that made the spec try for 64 GiB and more


def huge(batch, seq, width, dtype=np.float64):
    """A (batch, seq, width) array of zeros that holds one value (zero strides): the input of a
    huge call costs the test nothing."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype), (batch, seq, width), (0, 0, 0))


def test_the_limit_is_physical_memory_unless_the_user_sets_one(monkeypatch):
    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    limit, source = memory_limit()
    assert limit == os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert source.startswith("the machine's physical memory") and LIMIT_VARIABLE in source
    monkeypatch.setenv(LIMIT_VARIABLE, "1048576")
    assert memory_limit() == (1048576, f"{LIMIT_VARIABLE}=1048576")


@pytest.mark.parametrize("text", ["", "8G", "1.5e9", "0", "-1"], ids=["empty", "unit", "float", "zero", "negative"])
def test_a_bad_limit_is_refused_by_name(monkeypatch, text):
    monkeypatch.setenv(LIMIT_VARIABLE, text)
    with pytest.raises(ValueError, match=f"^{LIMIT_VARIABLE}: expected a number of bytes, an integer >= 1 .*; got {text!r}$"):
        memory_limit()


def test_the_refusal_names_the_call_each_need_and_the_limit(monkeypatch):
    monkeypatch.setenv(LIMIT_VARIABLE, str(2**20))
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    needs = scores_needs(cfg, 1, 1024, 1024, "float64", 8, padded=False)
    with pytest.raises(MemoryLimitError) as info:
        check_memory("ode_block: x of shape (1, 1024, 8)", *needs)
    assert str(info.value) == (
        "ode_block: x of shape (1, 1024, 8): needs an estimated 65.0 MiB (the attention scores, 4 x (1, 2, 1024, 1024) "
        "float64: 64.0 MiB; the mask, (1, 1, 1024, 1024) bool: 1.0 MiB), more than the memory limit of 1.0 MiB "
        f"({LIMIT_VARIABLE}=1048576)")
    assert isinstance(info.value, MemoryError) and isinstance(info.value, ValueError)  # the CLI: one line, exit 2
    monkeypatch.setenv(LIMIT_VARIABLE, str(2**30))
    assert check_memory("ode_block", *needs) == 65 * 2**20


def decoder(encoding="none", **kw):
    return R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=encoding != "none",
                       positional_encoding="rope" if encoding == "none" else encoding, **kw)


HUGE_CALLS = {
    "ode_block-T65536": lambda cfg, p: R.ode_block(p, huge(1, LONG, 8), cfg),
    "ode_block-T65536-alibi-padded": lambda cfg, p: R.ode_block(p, huge(1, LONG, 8), decoder("alibi"),
                                                                np.ones((1, LONG), bool)),
    "ode_func-T65536": lambda cfg, p: R.ode_func(p, 0.0, huge(1, LONG, 8), cfg),
    "prefill-max_len-1e9": lambda cfg, p: R.prefill(p, np.zeros((1, 3, 8)), cfg, max_len=10**9),
}


@pytest.mark.parametrize("call", list(HUGE_CALLS))
def test_the_spec_refuses_what_cannot_fit_before_allocating(call, monkeypatch):
    """Under the machine's own limit: T = 65,536 (scores of 4 x 2 x 65536^2 float64 = 256 GiB) and a
    cache of 10^9 slots (2 x 2 x 4 evaluations x 10^9 x 8 float64 = 954 GiB) exceed any machine
    this runs on; the test's own peak stays under 1 MiB, so nothing was allocated first."""
    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    cfg = decoder()
    params = R.init_params(cfg)
    tracemalloc.start()
    try:
        with pytest.raises(MemoryLimitError, match=r"^(ode_block|ode_func|prefill): x of shape .*: needs an estimated "
                                                   r".* more than the memory limit of .* \(the machine's physical memory"):
            HUGE_CALLS[call](cfg, params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20


def test_a_user_limit_refuses_a_call_that_fits_the_machine(monkeypatch):
    cfg = decoder()
    params, x = R.init_params(cfg), np.zeros((1, 64, 8))
    R.ode_block(params, x, cfg)
    monkeypatch.setenv(LIMIT_VARIABLE, str(64 * 64 * 2 * 8))  # one score array of the two heads
    with pytest.raises(MemoryLimitError, match=r"^ode_block: x of shape \(1, 64, 8\): needs an estimated 260.0 KiB "):
        R.ode_block(params, x, cfg)
    with pytest.raises(MemoryLimitError, match=r"^prefill: x of shape \(1, 3, 8\), max_len 64000: needs .*the KV cache"):
        R.prefill(params, x[:, :3], cfg, max_len=64_000)


@pytest.mark.parametrize("encoding,padded", [("none", False), ("rope", True), ("alibi", True)],
                         ids=["unpadded", "rope-padded", "alibi-padded"])
def test_the_spec_estimate_is_its_measured_peak(encoding, padded):
    """tracemalloc's peak of a whole block (NumPy reports its allocations) against the estimate:
    within [0.75, 1.5] of it (measured 0.99 to 1.01: four score arrays, the bias, the mask)."""
    from ode_ref.block import check_spec_memory

    cfg = decoder(encoding, ode_steps=1, ode_solver="euler")
    params, seq = R.init_params(cfg), 384
    x = np.random.default_rng(0).normal(size=(1, seq, 8))
    mask = np.ones((1, seq), bool) if padded else None
    tracemalloc.start()
    try:
        R.ode_block(params, x, cfg, mask)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    estimate = check_spec_memory("ode_block", cfg, x, mask)
    assert 0.75 <= estimate / peak <= 1.5, (estimate, peak)
