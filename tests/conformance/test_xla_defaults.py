"""The suite compiles its JAX programs with tests/conftest.py's XLA_TEST_FLAGS, which compile in less
CPU. The golden cases whose JAX outputs those options change in their last bits (measured: every
case in the three dtypes, under both) pass under XLA's defaults too: `odeattn conformance` in a
process of its own with XLA_FLAGS empty, as a user runs it."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

# In float32 or float64 (bfloat16: none), the cases whose outputs differ in some bit between the two
# sets of options: BitLinear's quantisation and the gradients' sums, rounded in another order.
CHANGED = ["block_derf_heun_decoder_bitnet_pad_s2_b1t1h1d6", "block_dynamic_tanh_ralston_decoder_bitnet_nopad_s4_b2t5h2d8",
           "block_dynamic_tanh_rk2_gated_decoder_bitnet_pad_s2_b1t1h1d6_positions-rope",
           "block_dynamic_tanh_rk38_decoder_bitnet_pad_s6_b2t4h1d10", "block_dynamic_tanh_rk4_decoder_bitnet_pad_s5_b2t5h2d8",
           "block_flash_norm_euler_encoder_bitnet_pad_s7_b1t9h4d16", "block_large_magnitude_layer_norm_bitnet_decoder",
           "block_rk4_s8_decoder_bitnet_pad_dyt", "block_rms_norm_heun_decoder_bitnet_pad_s3_b1t9h4d16",
           "block_tier_t65_b2_h2hd16_alibi_decoder_bitnet_pad", "decode_euler_s3_rms_norm_alibi_bitnet",
           "decode_rk38_derf_rope_bitnet_pad_odd_head_dim", "grad_derf_rk38_encoder_bitnet_pad_s2_alibi_b3t6h3d12",
           "grad_dynamic_tanh_midpoint_decoder_float_pad_s2_rope_b1t4h1d6", "grad_dynamic_tanh_rk38_decoder_float_nopad_s1_rope_b1t4h1d6",
           "grad_layer_norm_euler_decoder_float_nopad_s1_none_b2t5h2d8", "grad_rms_norm_euler_encoder_bitnet_pad_s2_rope_b1t4h1d6",
           "grad_rms_norm_ralston_encoder_bitnet_pad_s2_rope_b1t4h1d6"]


def test_the_cases_the_suite_s_xla_options_change_pass_under_xla_s_defaults(tmp_path, xla_test_flags):
    assert set(xla_test_flags) <= set(os.environ["XLA_FLAGS"].split())  # the suite's own JAX runs take them
    path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "odeattn", "conformance", "--backend", "jax", "--dtype", "float32", "--dtype", "float64",
            "--float64-bound", "1e-12", "-j", "1", "-k", f"^({'|'.join(CHANGED)})$", "--json", str(path)]
    done = subprocess.run(argv, env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(path.read_text())["results"]
    assert sorted((r["case"], r["dtype"]) for r in results) == sorted((c, d) for c in CHANGED for d in ("float32", "float64"))
    assert all(r["status"] == "passed" for r in results)
