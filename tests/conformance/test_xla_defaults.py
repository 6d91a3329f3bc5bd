"""The suite's JAX programs compile with tests/conftest.py's SUITE_XLA_FLAGS, which take less CPU.
Measured with jaxlib 0.10.2 over every golden case in the three dtypes, those options change some
bits of 18 cases' outputs and none of the others'; those 18 pass under XLA's defaults here:
`odeattn conformance` in a process of its own with XLA_FLAGS empty, as a user runs it. So the main
job's verdicts are the ones the defaults give. (After a jaxlib upgrade the list is measured again:
every case's outputs under both sets of options, compared bit for bit.) The suite's other JAX
tests compare a port with itself or hold a bound of many roundings; `pytest --xla-defaults` runs
them all under XLA's defaults."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

# In float32 or float64 (bfloat16: none): BitLinear's quantisation and the gradients' sums, rounded
# in another order, by a few roundings (float32 at most 2.6e-7 relative, float64 6.3e-16).
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


def test_the_cases_the_suite_s_xla_options_change_pass_under_xla_s_defaults(tmp_path):
    path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "odeattn", "conformance", "--backend", "jax", "--dtype", "float32", "--dtype", "float64",
            "--float64-bound", "1e-12", "-j", "1", "-k", f"^({'|'.join(CHANGED)})$", "--json", str(path)]
    done = subprocess.run(argv, env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(path.read_text())["results"]
    assert sorted((r["case"], r["dtype"]) for r in results) == sorted((c, d) for c in CHANGED for d in ("float32", "float64"))
    assert all(r["status"] == "passed" for r in results)
