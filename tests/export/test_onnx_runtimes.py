"""`odeattn export --target openvino|tract`: the block's ONNX file in a form the runtime runs,
checked in that runtime with its settings (export/standalone.py) as well as in ONNX Runtime."""

import json

import pytest

import ode_ref as R
from odeattn.cli import main

# each runtime, the forms it refuses, and the option it needs with the Loop form (None: it runs no Loop form)
RUNTIMES = {"openvino": ("OpenVINO", ["--functions", "--prefill", "--dtype float16"], "--steps-required"),
            "tract": ("tract", ["--functions", "--decode", "--steps-input", "--route torch"], None)}


@pytest.mark.parametrize("target", RUNTIMES)
def test_the_command_checks_the_file_in_its_runtime_and_refuses_a_form_it_does_not_run(target, tmp_path, capsys,
                                                                                        monkeypatch):
    """The file is checked in the runtime (its line in the report) and written; each form the
    runtime does not run is refused in one line, exit 2, nothing written; a runtime whose z is off
    by 1e-3, or that fails on the file, fails the command in one line, exit 1, before it writes:
    the file it would have replaced (--force) is left as it was."""
    pytest.importorskip(target)
    from odeattn.export import standalone

    runtime, refused, loop = RUNTIMES[target]
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, mode="decoder")
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(R.init_params(cfg, seed=1, perturb_norms=True), tmp_path / "w.safetensors")
    argv = ["export", "--config", str(tmp_path / "c.json"), "--weights", str(tmp_path / "w.safetensors"),
            "--target", target, "-o", str(tmp_path / "block.onnx")]
    assert main(argv) == 0
    assert f"\n  {runtime}: max relative error vs ode_ref (float64) on a random batch (2 x 8, padded on each side)" in (
        capsys.readouterr().out)
    for options in [*refused, *(["--steps-input"] if loop else [])]:
        assert main([*argv[:-1], str(tmp_path / "other.onnx"), *options.split()]) == 2
        line, = capsys.readouterr().err.strip().splitlines()
        assert line.startswith(f"odeattn export: {options.split()[0]}: "), line
        assert not (tmp_path / "other.onnx").exists()
    if loop is not None:
        assert main([*argv, "--force", "--steps-input", loop]) == 0
        capsys.readouterr()
    written, load = (tmp_path / "block.onnx").read_bytes(), standalone.load_onnx

    def fails(*a):
        raise RuntimeError("Exception from src/core\nCheck 'shape' failed")

    for wrong, message in ((lambda *a: lambda feed: {"z": load(*a)(feed)["z"] * (1 + 1e-3)}, "the artifact's check against ode_ref"),
                           (fails, f"{runtime} does not run the file (Exception from src/core; Check 'shape' failed)")):
        monkeypatch.setattr(standalone, "load_onnx", wrong)
        assert main([*argv, "--force"]) == 1
        out, err = capsys.readouterr()
        line, = err.strip().splitlines()
        assert f"--target {target}: {message}" in line and "wrote" not in out, line
        assert (tmp_path / "block.onnx").read_bytes() == written
