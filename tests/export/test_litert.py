"""The torch port converted to a LiteRT model at one shape (export/litert_program.py): `odeattn
export --target litert`, its conformance backend and fuzz --model --runtime litert, run where
neither odeattn nor ode_ref is imported."""

import hashlib
import importlib.metadata
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.cases.tolerance import relative_error, tolerance

pytest.importorskip("torch")
# found, not imported: litert-torch turns JAX's x64 mode on for the whole process at its import (the
# target imports it with the mode kept, litert_program._x64_for_litert), which would change the
# JAX tests that share this process
for _module in ("litert_torch", "ai_edge_litert"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"{_module} is not installed (the litert extra)", allow_module_level=True)

pytestmark = pytest.mark.xdist_group("export/test_litert")

# decoder mode with padding: a row padded on the left has queries that see no key; heun x 2 steps
CONFIG = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="heun", ode_steps=2, mode="decoder")
SHAPE = (3, 8)

# a deployer's device: LiteRT's interpreter alone, the model called at its own shape
RUNNER = """
import json, sys
import numpy as np
from ai_edge_litert.interpreter import Interpreter, OpResolverType
outputs = {}
for resolver in ("BUILTIN_WITHOUT_DEFAULT_DELEGATES", "AUTO"):  # AUTO: LiteRT's default, with XNNPACK
    interpreter = Interpreter(model_path=sys.argv[1], experimental_op_resolver_type=getattr(OpResolverType, resolver))
    data = np.load(sys.argv[2])
    outputs[resolver] = interpreter.get_signature_runner()(args_0=data["x"], args_1=data["mask"])["output_0"].tolist()
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("odeattn", "ode_ref", "torch"))
print(json.dumps({"outputs": outputs, "loaded": loaded}))
"""


@pytest.fixture(scope="session")
def written(tmp_path_factory):
    """(folder, argv) after `odeattn export --target litert --batch 3 --seq 8` wrote folder/block.tflite."""
    folder = tmp_path_factory.mktemp("litert")
    (folder / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    R.save_params(R.init_params(CONFIG, seed=0, perturb_norms=True), folder / "w.safetensors")
    argv = ["export", "--config", str(folder / "config.json"), "--weights", str(folder / "w.safetensors"),
            "--target", "litert", "--batch", str(SHAPE[0]), "--seq", str(SHAPE[1]), "-o", str(folder / "block.tflite")]
    assert main(argv) == 0
    return folder, argv


def test_the_command_refuses_what_litert_cannot_hold_and_a_model_off_the_spec(written, capsys, monkeypatch):
    """A config with tables in float64 or int64 (rope), a shape of no tokens, the other targets'
    options and another suffix are refused in one line before anything is built; a model whose
    output is 1e-3 off where a row is padded on the left exits 1 and writes nothing. The build left
    JAX's x64 mode as it was."""
    import jax

    from odeattn.export import litert_program

    # litert-torch turns JAX's x64 mode on for the process at its import; the target turns it back
    assert not jax.config.jax_enable_x64
    folder, argv = written
    rope = folder / "rope.json"
    rope.write_text(json.dumps({**CONFIG.to_dict(), "ode_use_pe": True, "positional_encoding": "rope"}))
    R.save_params(R.init_params(R.ODEConfig.from_any(json.loads(rope.read_text()))), folder / "rope.safetensors")

    def no_build(*a, **k):
        raise AssertionError("built before the options were checked")

    capsys.readouterr()
    monkeypatch.setattr(litert_program, "export_litert_block", no_build)
    out = ["-o", str(folder / "b.tflite")]
    for args, message in (([*argv[:2], str(rope), argv[3], str(folder / "rope.safetensors"), *argv[5:-2], *out],
                           "--config: positional_encoding: rope's tables are computed in float64 or int64"),
                          ([*argv[:-2], "--seq", "0", *out], "--seq: expected an integer >= 1"),
                          ([*argv[:-2], "--max-seq", "16", *out], "--max-seq: applies to --target executorch"),
                          ([*argv[:-2], "--max-positions", "8", *out], "--max-positions: applies to --target jax"),
                          ([*argv[:-2], "-o", str(folder / "block.onnx")], "-o: expected a file ending in .tflite")):
        assert main(args) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        assert err.startswith("odeattn export: ") and message in err, err
    assert main([*argv[:5], "--batch", "1", "-o", str(folder / "b.onnx")]) == 2
    assert "--batch: applies to --target litert" in capsys.readouterr().err
    model = (folder / "block.tflite").read_bytes()
    made = litert_program.litert_runner
    monkeypatch.setattr(litert_program, "export_litert_block", lambda *a, **k: model)
    monkeypatch.setattr(litert_program, "litert_runner", lambda blob: lambda x, m: made(blob)(x, m) * (1.001 if not m[:, 0].all() else 1))
    assert main([*argv[:-2], *out]) == 1 and not (folder / "b.tflite").exists()
    assert "over float32's tolerance" in capsys.readouterr().err


def test_the_model_runs_at_its_shape_where_litert_alone_is_imported(written):
    """At its batch 3 x seq 8, rows padded on the right and on the left, the model is the spec within
    the float32 tolerance of the spec's own error through LiteRT's built-in kernels, in a process
    that imports neither odeattn, ode_ref nor torch. With LiteRT's default XNNPACK delegate the row
    padded on the left is NaN (litert 2.3.0): why the runner turns the delegate off."""
    folder, _ = written
    params = R.load_params(folder / "w.safetensors")
    x, mask = np.random.default_rng(1).normal(size=(*SHAPE, 8)), np.ones(SHAPE, bool)
    mask[1, 5:] = mask[2, :3] = False
    np.savez(folder / "in.npz", x=x.astype(np.float32), mask=mask)
    out = subprocess.run([sys.executable, "-c", RUNNER, str(folder / "block.tflite"), str(folder / "in.npz")],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["loaded"] == []
    want = R.ode_block(params, x, CONFIG, mask)
    e32 = relative_error(R.ode_block(params, x.astype(np.float32), CONFIG, mask), want)
    assert relative_error(np.asarray(report["outputs"]["BUILTIN_WITHOUT_DEFAULT_DELEGATES"]), want) <= tolerance(e32, "float32")
    xnnpack = np.asarray(report["outputs"]["AUTO"])
    assert np.isnan(xnnpack[2]).any() and not np.isnan(xnnpack[:2]).any()


def test_the_runner_takes_a_half_input_as_its_float32_value_and_refuses_another_shape(written):
    """x in float16 is run as float32 holds it (exactly), as every artifact runner takes it
    (export.artifact_inputs): the same bits as the float32 input's; another batch is PastBounds."""
    from odeattn.export import PastBounds
    from odeattn.export.litert_program import litert_runner

    folder, _ = written
    run = litert_runner((folder / "block.tflite").read_bytes())
    x16 = np.random.default_rng(2).normal(size=(*SHAPE, 8)).astype(np.float16)
    got = run(x16)
    assert got.dtype == np.float32 and np.array_equal(got, run(x16.astype(np.float32)))
    with pytest.raises(PastBounds, match=r"^x: the model holds batch 3 x seq 8; got 2 x 8$"):
        run(x16[:2])


def test_fuzz_judges_the_model_at_its_shape_and_catches_other_weights(written, capsys, refused_in_one_line):
    """fuzz --model --runtime litert: every draw at the model's shape, judged against the spec, the
    report naming the model's sha256 and LiteRT's version; the same model judged against other
    weights diverges (exit 1). Refused in one line: a config of another width (the model stores no
    config), the model given to another runtime, and a file that is no model."""
    folder, _ = written
    model = folder / "block.tflite"
    argv = ["conformance", "fuzz", "--model", str(model), "--config", str(folder / "config.json"),
            "--weights", str(folder / "w.safetensors"), "--runtime", "litert", "--examples", "20"]
    assert main([*argv, "--repro", str(folder / "r0"), "--json", str(folder / "r.json")]) == 0
    report = json.loads((folder / "r.json").read_text())
    assert report["artifact"] == {"file": model.name, "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                                  "runtime": "litert", "runtime_version": importlib.metadata.version("ai-edge-litert")}
    R.save_params(R.init_params(CONFIG, seed=1, perturb_norms=True), folder / "other.safetensors")
    assert main([*argv[:7], str(folder / "other.safetensors"), *argv[8:], "--repro", str(folder / "r1")]) == 1
    wide = R.ODEConfig(hidden_size=12, num_heads=2)
    (folder / "wide.json").write_text(json.dumps(wide.to_dict()))
    R.save_params(R.init_params(wide), folder / "wide.safetensors")
    capsys.readouterr()
    for changed, message in (({5: str(folder / "wide.json"), 7: str(folder / "wide.safetensors")},
                              "--config: expected the config the file was exported with; its hidden_size is 12, the "
                              "model's d_model 8"),
                             ({9: "onnxruntime"}, "is a .tflite file, which --runtime litert runs; got --runtime onnxruntime"),
                             ({3: str(folder / "config.json")}, "expected a LiteRT .tflite block model")):
        refused_in_one_line([*argv, "--repro", str(folder / "r2")], changed, message)


def test_the_backend_passes_a_block_case_and_skips_one_litert_cannot_hold():
    """Its conformance row: the golden set's smallest block case converted at its shape and judged
    at z1; a RoPE case skipped with the reason. The 116 block cases take about 8 min on 2 cores
    (docs/deployment.md)."""
    assert main(["conformance", "--backend", "litert", "-j", "1", "--dtype", "float32",
                 "-k", "^block_derf_euler_encoder_float_nopad_s1_b2t5h2d8(_positions-rope)?$"]) == 0
