"""`odeattn export` on bad input: one line naming the option, exit 2, nothing written, before any work."""

import pytest

EXPORT = ["export", "--config", "{d}/c.json", "--weights", "{d}/w.safetensors"]


@pytest.mark.parametrize("argv, message", [
    pytest.param(EXPORT + ["-o", "{d}/missing/m.onnx"], "-o: the folder '{d}/missing' does not exist", id="output-in-a-missing-folder"),
    pytest.param(EXPORT + ["-o", "{d}"], "-o: expected a file path; got the folder '{d}'", id="output-is-a-folder"),
    pytest.param(EXPORT + ["-o", "/proc/m.onnx"], "-o: '/proc/m.onnx' is not writable", id="output-not-writable"),
    pytest.param(EXPORT + ["-o", "{d}/x.json"], "-o: expected a file ending in .onnx; got '{d}/x.json'", id="output-not-onnx"),
    pytest.param(["export", "--config", "{d}/c.json", "--weights", "{d}/nan.safetensors", "-o", "{d}/n.onnx"],
                 "--weights: params['ode_func.out_proj.weight'] holds NaN or Inf", id="weights-with-nan"),
    pytest.param(["export", "--config", "{d}/bad.json", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx"],
                 "--config '{d}/bad.json': not valid JSON", id="config-not-json"),
    pytest.param(["export", "--config", "{d}", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx"],
                 "--config: Is a directory: '{d}'", id="config-is-a-folder"),
    pytest.param(["export", "--config", "{d}/dec.json", "--weights", "{d}/w.safetensors", "-o", "{d}/n.onnx", "--decode",
                  "--no-padding-mask"], "--no-padding-mask: expected the block or prefill model; the decode-step model's "
                 "padding_mask is the cache's record of which slots hold real tokens", id="no-padding-mask-for-the-decode-step-model"),
])
def test_bad_input_is_refused_in_one_line_with_exit_2(files, argv, message, capsys, refused_in_one_line):
    import json

    (files / "dec.json").write_text(json.dumps({**json.loads((files / "c.json").read_text()), "mode": "decoder"}))
    refused_in_one_line(files, argv, message, capsys)
