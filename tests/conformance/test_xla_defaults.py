"""The suite's JAX programs compile with tests/conftest.py's SUITE_XLA_FLAGS, which take less CPU.
On this project's CI machine those options change some bits of the outputs of the cases below, in
the dtype each is listed under, and of no other case's (`python benchmarks/xla_options.py`
measures it, every case in the three dtypes compared bit for bit; XLA compiles for the host CPU,
so the list is measured again after a jaxlib upgrade or on another CPU). Those cases pass under
XLA's defaults here: `odeattn conformance` in a process of its own with XLA_FLAGS empty, as a user
runs it. So the main job's verdicts are the ones the defaults give. The suite's other JAX tests
run under the suite's options; `pytest --xla-defaults` runs them with XLA_FLAGS as given."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("jax")

# dtype -> the cases whose outputs SUITE_XLA_FLAGS change in it, measured by benchmarks/xla_options.py
# (float32: 27 of 362 outputs, at most 3.0e-7 of the output's largest entry; float64: 32 of 362,
# 5.6e-16; bfloat16: none of 219): BitLinear's quantisation and the gradients' sums, rounded in
# another order.
CHANGED = {
    "float32": ["block_dynamic_tanh_ralston_decoder_bitnet_nopad_s4_b2t5h2d8",
                "block_dynamic_tanh_rk4_decoder_bitnet_pad_s5_b2t5h2d8",
                "block_large_magnitude_layer_norm_bitnet_decoder",
                "block_rms_norm_heun_decoder_bitnet_pad_s3_b1t9h4d16",
                "block_tier_t65_b2_h2hd16_alibi_decoder_bitnet_pad", "decode_euler_s3_rms_norm_alibi_bitnet",
                "grad_dynamic_tanh_midpoint_decoder_float_pad_s2_rope_b1t4h1d6",
                "grad_dynamic_tanh_rk38_decoder_float_nopad_s1_rope_b1t4h1d6",
                "grad_layer_norm_euler_decoder_float_nopad_s1_none_b2t5h2d8",
                "grad_rms_norm_euler_encoder_bitnet_pad_s2_rope_b1t4h1d6",
                "grad_rms_norm_ralston_encoder_bitnet_pad_s2_rope_b1t4h1d6"],
    "float64": ["block_dynamic_tanh_ralston_decoder_bitnet_nopad_s4_b2t5h2d8",
                "block_dynamic_tanh_rk2_gated_decoder_bitnet_pad_s2_b1t1h1d6_positions-rope",
                "block_flash_norm_euler_encoder_bitnet_pad_s7_b1t9h4d16",
                "block_large_magnitude_layer_norm_bitnet_decoder", "block_rk4_s8_decoder_bitnet_pad_dyt",
                "block_rms_norm_heun_decoder_bitnet_pad_s3_b1t9h4d16",
                "block_tier_t65_b2_h2hd16_alibi_decoder_bitnet_pad", "decode_euler_s3_rms_norm_alibi_bitnet",
                "decode_rk38_derf_rope_bitnet_pad_odd_head_dim",
                "grad_dynamic_tanh_midpoint_decoder_float_pad_s2_rope_b1t4h1d6",
                "grad_dynamic_tanh_rk38_decoder_float_nopad_s1_rope_b1t4h1d6",
                "grad_layer_norm_euler_decoder_float_nopad_s1_none_b2t5h2d8",
                "grad_rms_norm_euler_encoder_bitnet_pad_s2_rope_b1t4h1d6",
                "grad_rms_norm_rk4_encoder_bitnet_pad_s2_rope_b1t4h1d6"],
    "bfloat16": [],
}


@pytest.mark.parametrize("dtype", [d for d in CHANGED if CHANGED[d]])
def test_the_cases_the_suite_s_xla_options_change_pass_under_xla_s_defaults(tmp_path, dtype):
    path = tmp_path / "report.json"
    argv = [sys.executable, "-m", "odeattn", "conformance", "--backend", "jax", "--dtype", dtype, "--float64-bound", "1e-12",
            "-j", "1", "-k", f"^({'|'.join(CHANGED[dtype])})$", "--json", str(path)]
    done = subprocess.run(argv, env={**os.environ, "XLA_FLAGS": ""}, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(path.read_text())["results"]
    assert sorted(r["case"] for r in results) == sorted(CHANGED[dtype]) and {r["dtype"] for r in results} == {dtype}
    assert all(r["status"] == "passed" for r in results)
