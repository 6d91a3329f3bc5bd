"""The suite compiles its JAX programs with tests/conftest.py's XLA_TEST_FLAGS, which compile in less
CPU. A sample of the golden cases whose JAX outputs those options change in their last bits (measured:
every case in the three dtypes, under both) passes under XLA's defaults too: `odeattn conformance` in a
process of its own with XLA_FLAGS empty, as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

# Of the 18 cases whose outputs differ in some bit between the two sets of options, in float32 or
# float64 (bfloat16: none), one of each kind and the largest block: BitLinear's quantisation and the
# gradients' sums, rounded in another order. (All 18 passed under both when measured, in the main
# job's three dtypes; each program under the defaults is one more compile with empty caches, 1-2 s.)
CHANGED = ["block_tier_t65_b2_h2hd16_alibi_decoder_bitnet_pad", "block_flash_norm_euler_encoder_bitnet_pad_s7_b1t9h4d16",
           "decode_rk38_derf_rope_bitnet_pad_odd_head_dim", "grad_derf_rk38_encoder_bitnet_pad_s2_alibi_b3t6h3d12",
           "grad_dynamic_tanh_midpoint_decoder_float_pad_s2_rope_b1t4h1d6"]


def test_cases_the_suite_s_xla_options_change_pass_under_xla_s_defaults(tmp_path, xla_test_flags):
    assert set(xla_test_flags) <= set(os.environ["XLA_FLAGS"].split())  # the suite's own JAX runs take them
    path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "odeattn", "conformance", "--backend", "jax", "--dtype", "float32", "--dtype", "float64",
            "--float64-bound", "1e-12", "-j", "1", "-k", f"^({'|'.join(CHANGED)})$", "--json", str(path)]
    done = subprocess.run(argv, env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(path.read_text())["results"]
    assert sorted((r["case"], r["dtype"]) for r in results) == sorted((c, d) for c in CHANGED for d in ("float32", "float64"))
    assert all(r["status"] == "passed" for r in results)
