"""The tract backend: the exported block and encoder stack loaded by tract (export/tract_program.py,
docs/deployment.md)."""

import json

import pytest

pytest.importorskip("tract")

import ode_ref as R
from odeattn.cli import main

# padded and causal blocks (the positions' CumSum, the causal Trilu), a BitLinear block, the
# time-dependent encoder stacks (their causal triangle) and a decode case
CASES = ("block_rope_decoder_bitnet_pad", "block_field_alibi_scale_h4_decoder_pad",
         "block_pos_pape_decoder_ssmax_nopad_dynamic_tanh_heun_b3t6h2d10",
         "encoder_euler_paper_pre_nopad_l1_b1t4h1c6f10_temb3_sin4", "encoder_euler_paper_pre_pad_l3_b2t5h2c8f12_temb4_sin2",
         "decode_rk4_layer_norm_rope_pad")


def test_the_tract_backend_passes_the_block_and_encoder_cases_and_has_no_decoding(tmp_path):
    """Its conformance row on cases that tract 0.23 could not run before the export's tract forms;
    a decode case is not supported (the form has no run_decode). The whole set, 140 cases it
    runs, takes about 13 s on 2 cores (docs/deployment.md)."""
    report = tmp_path / "r.json"
    assert main(["conformance", "--backend", "tract", "-k", "|".join(f"^{c}$" for c in CASES), "--json", str(report)]) == 0
    results = {r["case"]: r for r in json.loads(report.read_text())["results"]}
    assert sorted(results) == sorted(CASES)
    assert sorted(c for c, r in results.items() if r["status"] == "passed") == sorted(c for c in CASES if not c.startswith("decode_"))
    decode = results["decode_rk4_layer_norm_rope_pad"]
    assert decode["status"] == "skipped" and "(the backend has no run_decode)" in decode["message"]


@pytest.mark.parametrize("encoding", ["rope", "hope"])
def test_a_head_of_width_1_runs_in_tract_unrotated(encoding):
    """A head of width 1 has no pair to rotate: the export leaves it as it is, with no empty array
    (tract refused the file's zero-width reshape), and tract gives the spec's z(1)."""
    import numpy as np

    from odeattn.conformance.cases.tolerance import relative_error, tolerance
    from odeattn.export.block import export_model
    from odeattn.export.runtime import make_feed
    from odeattn.export.standalone import load_onnx

    cfg = R.ODEConfig(hidden_size=2, num_heads=2, mode="decoder", ode_use_pe=True, positional_encoding=encoding)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    x, mask = np.random.default_rng(0).normal(size=(2, 5, 2)), np.array([[True] * 5, [False, False, True, True, True]])
    model = export_model(cfg, params)
    z = load_onnx("tract", model)(make_feed(model, x.astype(np.float32), mask))["z"]
    want = R.ode_block(params, x, cfg, mask)
    assert relative_error(z, want) <= tolerance(relative_error(R.ode_block(params, x.astype(np.float32), cfg, mask), want),
                                                "float32")


def test_the_exported_file_runs_through_tract_alone_at_any_batch_and_sequence(tmp_path, runs_alone):
    """`odeattn export`'s default file, at opset 17 and 23 (its Attention), run by a fresh process
    that imports only NumPy and tract (export/standalone.py, copied beside it), gives z(1) within the suite's float32 rule at two shapes, a
    row padded on the left."""
    from odeattn.export import standalone

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, mode="decoder", ode_use_pe=True, positional_encoding="rope")
    params = R.init_params(cfg, seed=0, perturb_norms=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    for opset in ("17", "23"):
        assert main(["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "w.safetensors"),
                     "--opset", opset, "-o", str(tmp_path / "block.onnx"), "--force"]) == 0
        runs_alone(standalone.__file__, "from standalone import load; np.save('z.npy', load('tract', open('block.onnx', "
                   "'rb').read(), ['x', 'padding_mask'], ['z'])({'x': np.load('x.npy'), 'padding_mask': np.load('mask.npy')})['z'])",
                   cfg, params)


def test_fuzz_refuses_in_one_line_the_forms_tract_does_not_run(tmp_path, capsys, monkeypatch):
    """fuzz --model --runtime tract: a file with local functions, the Loop form or a bfloat16 file
    is a usage error naming the form, before tract loads it, and a file tract fails to load one
    naming tract's error, without its backtrace (the default form's run: test_fuzz.py)."""
    from safetensors.numpy import save_file

    from odeattn.export import tract_program
    from odeattn.export.block import export_model

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2)
    params = R.init_params(cfg, seed=2)
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    save_file(params, str(tmp_path / "w.safetensors"))
    argv = ["conformance", "fuzz", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
            "--runtime", "tract", "--examples", "3", "--repro", str(tmp_path / "repro")]
    for form, message in (({"functions": True}, "a file with ONNX local functions"),
                          ({"steps_input": True, "steps_default": False}, "the Loop form (--steps-input)"),
                          ({"dtype": "bfloat16", "keep_io_types": True}, "a bfloat16 file")):
        (tmp_path / "form.onnx").write_bytes(export_model(cfg, params, **form).SerializeToString())
        assert main([*argv, "--model", str(tmp_path / "form.onnx")]) == 2
        line, = capsys.readouterr().err.strip().splitlines()
        assert message in line, line
    (tmp_path / "loop.onnx").write_bytes(export_model(cfg, params, steps_input=True, steps_default=False).SerializeToString())
    monkeypatch.setattr(tract_program, "unsupported_form", lambda model: None)  # the Loop form, loaded by tract
    assert main([*argv, "--model", str(tmp_path / "loop.onnx")]) == 2
    line, = capsys.readouterr().err.strip().splitlines()
    assert "--model: tract does not load the file: Translating node" in line and "Unimplemented(Loop)" in line, line
    assert not (tmp_path / "repro").exists()
