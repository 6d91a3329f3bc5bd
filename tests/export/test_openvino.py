"""The openvino backend: the exported block, prefill and decode-step models compiled by OpenVINO's
CPU plugin with the float32 hint (docs/deployment.md)."""

import pytest

pytest.importorskip("openvino")

from odeattn.cli import main


def test_the_openvino_backend_passes_the_decode_field_and_a_successors_case():
    """Its conformance row on every cached-decoding case (the prefill and decode-step models), the
    field cases (ALiBi's scale, the rotary bases, HoPE, BAM) and the encoder case of PCformer's
    corrector over a Macaron layer; the whole set, 150 cases it runs, takes about 30 s on 2 cores
    (docs/deployment.md)."""
    assert main(["conformance", "--backend", "openvino", "-k", "^decode_|_field_|_alphavector_corrector_macaron$"]) == 0


def test_openvino_folds_a_stored_steps_default_and_takes_a_required_steps_input():
    """The Loop form with its stored default (ode_steps 4) loses its steps input in OpenVINO (folded
    to the constant: a feed naming steps is refused) and runs 4 steps; exported with steps required
    (steps_default=False) it runs the count fed, each within the suite's float32 rule against the
    spec at that count."""
    import dataclasses

    import numpy as np

    import ode_ref as R
    from odeattn.export.standalone import load_onnx
    from odeattn.conformance.cases.tolerance import relative_error, tolerance
    from odeattn.export.block import export_model

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=4)
    params = R.init_params(cfg, seed=1, perturb_norms=True)
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    feed = {"x": x.astype(np.float32), "padding_mask": np.ones((2, 5), bool)}

    def within(z, steps):
        at = dataclasses.replace(cfg, ode_steps=steps)
        want = R.ode_block(params, x, at)
        return relative_error(z, want) <= tolerance(relative_error(R.ode_block(params, x.astype(np.float32), at), want),
                                                    "float32")

    folded = load_onnx("openvino", export_model(cfg, params, steps_input=True))
    with pytest.raises(RuntimeError, match="Port for tensor name steps was not found"):
        folded({**feed, "steps": np.array(1, np.int64)})
    assert within(folded(feed)["z"], 4)
    required = load_onnx("openvino", export_model(cfg, params, steps_input=True, steps_default=False))
    for steps in (1, 2, 16):
        assert within(required({**feed, "steps": np.array(steps, np.int64)})["z"], steps), steps


def test_the_onnx_file_runs_through_openvino_alone_with_the_float32_hint(tmp_path, runs_alone):
    """The file `odeattn export` writes, compiled by a fresh process that imports only NumPy and
    OpenVINO with the deployer's one setting, the float32 inference hint, gives z(1) within the
    suite's float32 rule at two shapes, a row padded on the left."""
    import json

    import ode_ref as R

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, mode="decoder", ode_use_pe=True, positional_encoding="rope")
    params = R.init_params(cfg, seed=0, perturb_norms=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    assert main(["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "w.safetensors"),
                 "-o", str(tmp_path / "block.onnx")]) == 0
    runs_alone(None, "import openvino as ov; block = ov.Core().compile_model('block.onnx', 'CPU', "
                     "{'INFERENCE_PRECISION_HINT': 'f32'}); np.save('z.npy', block({'x': np.load('x.npy'), "
                     "'padding_mask': np.load('mask.npy')})[block.outputs[0]])", cfg, params)
