"""The block as jax.export's serialized program (export/jax_program.py, `odeattn export --target
jax`, the jax-export backend): batch and sequence symbolic, run where neither odeattn nor ode_ref
is imported."""

import json
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("jax")

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.cases.tolerance import relative_error, tolerance
from odeattn.export.jax_program import export_jax_block

# what a deployer's server runs: jax and NumPy alone, the program called at each input's own shape
RUNNER = """
import json, sys
import numpy as np
from jax import export
program = export.deserialize(bytearray(open(sys.argv[1], "rb").read()))
outputs = {}
for name in sys.argv[2:]:
    data = np.load(name)
    try:
        outputs[name] = np.asarray(program.call(data["x"], data["mask"])).tolist()
    except Exception as err:
        outputs[name] = type(err).__name__
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("odeattn", "ode_ref"))
print(json.dumps({"outputs": outputs, "loaded": loaded}))
"""


def test_the_program_runs_at_any_batch_and_sequence_in_a_process_with_jax_alone(tmp_path):
    """RoPE with padding, exported with a bound of 16 positions: at batch 1 x seq 3 and batch 3 x
    seq 16 it is the spec within the float32 tolerance of the spec's own error; past 16 tokens the
    call is refused (the shape constraint), in a process that imports neither odeattn nor ode_ref."""
    cfg = R.ODEConfig(hidden_size=16, num_heads=2, ode_use_pe=True, positional_encoding="rope", mode="decoder")
    params = R.init_params(cfg, seed=3, perturb_norms=True)
    (tmp_path / "block.jaxexport").write_bytes(export_jax_block(cfg, params, max_positions=16))
    rng, inputs = np.random.default_rng(0), {}
    for batch, seq in ((1, 3), (3, 16), (1, 17)):
        x, mask = rng.normal(size=(batch, seq, 16)), np.ones((batch, seq), bool)
        mask[-1, seq // 2:] = False
        inputs[str(tmp_path / f"{batch}x{seq}.npz")] = x, mask
        np.savez(tmp_path / f"{batch}x{seq}.npz", x=x.astype(np.float32), mask=mask)
    out = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "block.jaxexport"), *inputs],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout)
    assert report["loaded"] == []
    for name, (x, mask) in inputs.items():
        if x.shape[1] > 16:
            assert report["outputs"][name] == "ValueError", name
            continue
        want = R.ode_block(params, x, cfg, mask)
        e32 = relative_error(R.ode_block(params, x.astype(np.float32), cfg, mask), want)
        assert relative_error(np.asarray(report["outputs"][name]), want) <= tolerance(e32, "float32"), name


def test_arguments_it_cannot_take_are_refused_by_name():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    params = R.init_params(cfg)
    rope = R.ODEConfig(hidden_size=8, num_heads=2, ode_use_pe=True, positional_encoding="hope")
    for config, kwargs, message in ((cfg, dict(dtype="float16"), "dtype: expected one of float32, float64"),
                                    (rope, dict(), "max_positions: hope gathers its angles"),
                                    (rope, dict(max_positions=0), "got 0"),
                                    (cfg, dict(max_positions=64), "max_positions: only rope, sinusoidal_rotary, hope")):
        with pytest.raises(ValueError, match=message):
            export_jax_block(config, R.init_params(config) if config is rope else params, **kwargs)


def test_the_command_writes_the_program_and_refuses_onnx_options(tmp_path, capsys, monkeypatch):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_use_pe=True, positional_encoding="sinusoidal_rotary")
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(R.init_params(cfg, seed=1), tmp_path / "w.safetensors")
    argv = ["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "w.safetensors"),
            "--target", "jax", "-o", str(tmp_path / "block.jaxexport")]
    for extra, message in ((["--opset", "23"], "--opset: applies to --target onnx"),
                           ([], "--max-positions: sinusoidal_rotary gathers its angles"),
                           (["--max-positions", "-1"], "got -1"),
                           (["--max-positions", "32", "--platforms", "cpu,gpu"], "--platforms: expected one or more of")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("odeattn export: ") and message in err and "\n" not in err
    from odeattn.export import jax_program

    made = jax_program.jax_runner  # a program off by 1e-3 fails the check: exit 1, nothing written
    monkeypatch.setattr(jax_program, "jax_runner", lambda blob: lambda x, m: made(blob)(x, m) * 1.001)
    assert main([*argv, "--max-positions", "32"]) == 1 and not (tmp_path / "block.jaxexport").exists()
    assert "over float32's tolerance" in capsys.readouterr().err
    monkeypatch.setattr(jax_program, "jax_runner", made)
    assert main([*argv, "--max-positions", "32", "--platforms", "cpu,cuda"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {tmp_path / 'block.jaxexport'}: ") and "for cpu, cuda" in out and "seq <= 32" in out
    assert main([*argv[:-4], "-o", str(tmp_path / "b.onnx"), "--max-positions", "32"]) == 2
    assert "--max-positions: applies to --target jax" in capsys.readouterr().err


def test_the_jax_export_backend_passes_the_golden_cases_of_its_form():
    """Its conformance row on the field cases and the tier's 17-token cases: each block exported,
    serialized and run through jax alone; the decode, grad, encoder and LM cases skipped (the
    program returns z(1) only). The whole set takes a minute (docs/deployment.md)."""
    assert main(["conformance", "--backend", "jax-export", "-k", "_field_|tier_t17_", "--dtype", "float32"]) == 0


def test_fuzz_judges_the_program_within_its_positions_and_catches_other_weights(tmp_path, capsys, refused_in_one_line):
    """fuzz --model block.jaxexport --runtime jax: drawn inputs judged against the spec, a draw past
    the program's positions not supported (jax refuses it), the report naming jax's version; the
    same program judged against other weights diverges (exit 1). Refused in one line: a program
    of another width than --config's (the program stores no config), the program given to another
    runtime, a file that is no program, and a float64 program."""
    import hashlib
    import importlib.metadata

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="euler", ode_steps=2, ode_use_pe=True,
                      positional_encoding="rope", mode="decoder")
    params = R.init_params(cfg, seed=0, perturb_norms=True)
    model = tmp_path / "block.jaxexport"
    model.write_bytes(export_jax_block(cfg, params, max_positions=24))
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    argv = ["conformance", "fuzz", "--model", str(model), "--config", str(tmp_path / "c.json"),
            "--weights", str(tmp_path / "w.safetensors"), "--runtime", "jax", "--examples", "20"]
    assert main([*argv, "--repro", str(tmp_path / "r0"), "--json", str(tmp_path / "r.json")]) == 0
    assert "the program holds at most the positions it was exported with" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["artifact"] == {
        "file": model.name, "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "runtime": "jax",
        "runtime_version": importlib.metadata.version("jax")}
    R.save_params(R.init_params(cfg, seed=1, perturb_norms=True), tmp_path / "other.safetensors")
    assert main([*argv[:7], str(tmp_path / "other.safetensors"), *argv[8:], "--repro", str(tmp_path / "r1")]) == 1
    wide = R.ODEConfig(hidden_size=12, num_heads=2)
    (tmp_path / "wide.json").write_text(json.dumps(wide.to_dict()))
    R.save_params(R.init_params(wide), tmp_path / "wide.safetensors")
    with __import__("jax").enable_x64(True):
        (tmp_path / "b64.jaxexport").write_bytes(export_jax_block(cfg, params, dtype="float64", max_positions=24))
    capsys.readouterr()
    for changed, message in (({5: str(tmp_path / "wide.json"), 7: str(tmp_path / "wide.safetensors")},
                              "--config: expected the config the file was exported with; its hidden_size is 12, the "
                              "program's d_model 8"),
                             ({9: "onnxruntime"}, "is a .jaxexport file, which --runtime jax runs; got --runtime onnxruntime"),
                             ({3: str(tmp_path / "c.json")}, "expected a serialized jax.export program"),
                             ({3: str(tmp_path / "b64.jaxexport")}, "expected a float32 program (fuzz judges float32)")):
        refused_in_one_line([*argv, "--repro", str(tmp_path / "r2")], changed, message)
