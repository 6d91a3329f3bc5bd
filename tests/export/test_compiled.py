"""The torch port compiled ahead of time: an AOTInductor package (export/aoti_program.py) and an
ExecuTorch program (export/executorch_program.py), each through `odeattn export --target`, its
conformance backend and fuzz --model --runtime, run where neither odeattn nor ode_ref is
imported. Each artifact is a build of tens of seconds, so each target builds two: the command's,
shared by its tests (one xdist group), and its conformance row's one case."""

import hashlib
import importlib.metadata
import json
import subprocess
import sys
from dataclasses import dataclass

import numpy as np
import pytest

pytest.importorskip("torch")

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.cases.tolerance import relative_error, tolerance

pytestmark = pytest.mark.xdist_group("export/test_compiled")

# decoder mode, RoPE and padding: positions and the mask both matter; euler x 2 steps, 2 evaluations
# of f (each a build of its kernels)
CONFIG = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="euler", ode_steps=2, mode="decoder", ode_use_pe=True,
                     positional_encoding="rope")


@dataclass(frozen=True)
class Target:
    name: str  # --target and --runtime and the backend's name
    suffix: str
    package: str  # the Python package whose version a fuzz report records
    runner: str  # a deployer's server: the artifact loaded and called at each input's own shape


TARGETS = [
    Target("aoti", ".pt2", "torch", """
import io, sys, numpy as np, torch
model = torch._inductor.aoti_load_package(io.BytesIO(open(sys.argv[1], "rb").read()))
call = lambda x, mask: model(torch.as_tensor(x), padding_mask=torch.as_tensor(mask)).numpy()
"""),
    Target("executorch", ".pte", "executorch", """
import sys, numpy as np, torch
from executorch.runtime import Runtime
data = open(sys.argv[1], "rb").read()
program = Runtime.get().load_program(data)
method = program.load_method("forward")
call = lambda x, mask: method.execute([torch.as_tensor(x), torch.as_tensor(mask)])[0].numpy().copy()
"""),
]
RUN = """
import json
outputs = {name: call(np.load(name)["x"], np.load(name)["mask"]).tolist() for name in sys.argv[2:]}
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("odeattn", "ode_ref"))
print(json.dumps({"outputs": outputs, "loaded": loaded}))
"""


@pytest.fixture(scope="module", params=TARGETS, ids=lambda t: t.name)
def written(request, tmp_path_factory):
    """(target, folder, its argv) after `odeattn export --target T` wrote folder/block.<suffix>."""
    target = request.param
    pytest.importorskip(target.package)
    folder = tmp_path_factory.mktemp(target.name)
    params = R.init_params(CONFIG, seed=0, perturb_norms=True)
    (folder / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    R.save_params(params, folder / "w.safetensors")
    argv = ["export", "--config", str(folder / "config.json"), "--weights", str(folder / "w.safetensors"),
            "--target", target.name, "-o", str(folder / f"block{target.suffix}")]
    assert main(argv) == 0
    return target, folder, argv


def test_the_command_refuses_other_targets_options_and_an_artifact_off_the_spec(written, capsys, monkeypatch):
    """The ONNX file's, the jax target's and the other targets' options, a bound too small and
    another suffix are refused in one line before anything is built; an artifact whose output is
    1e-3 off where a row is padded on the left (the check's second batch) exits 1 and writes
    nothing."""
    from odeattn.export import aoti_program, executorch_program

    target, folder, argv = written
    module, export, runner = {"aoti": (aoti_program, "export_aoti_block", "aoti_runner"),
                              "executorch": (executorch_program, "export_executorch_block", "executorch_runner")}[target.name]

    def no_build(*a, **k):
        raise AssertionError("built before the options were checked")

    capsys.readouterr()
    monkeypatch.setattr(module, export, no_build)
    refused = [(["--opset", "23"], "--opset: applies to --target onnx"),
               (["--steps-input"], "--steps-input: applies to --target onnx"),
               (["--max-positions", "8"], "--max-positions: applies to --target jax"),
               (["--batch", "2"], "--batch: applies to --target litert"),
               (["-o", str(folder / "block.onnx")], f"-o: expected a file ending in {target.suffix}")]
    refused += ([(["--max-seq", "4", "-o", str(folder / "b4.pte")], "--max-seq: expected an integer >= 8")] if target.name == "executorch"
                else [(["--max-batch", "4"], "--max-batch: applies to --target executorch")])
    for extra, message in refused:
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("odeattn export: ") and message in err and "\n" not in err, err
    artifact = (folder / f"block{target.suffix}").read_bytes()
    made = getattr(module, runner)
    monkeypatch.setattr(module, export, lambda *a, **k: artifact)
    monkeypatch.setattr(module, runner, lambda blob: lambda x, m: made(blob)(x, m) * (1.001 if not m[:, 0].all() else 1))
    other = folder / f"other{target.suffix}"
    assert main([*argv[:-1], str(other)]) == 1 and not other.exists()
    assert "over float32's tolerance" in capsys.readouterr().err


def test_the_artifact_runs_at_any_batch_and_sequence_in_a_process_without_odeattn(written):
    """At batch 1 x seq 1, 3 x 5 and 1 x 21, none the check's 2 x 8, each with padding, the artifact
    is the spec within the float32 tolerance of the spec's own error, in a process that imports
    neither odeattn nor ode_ref."""
    target, folder, _ = written
    params = R.load_params(folder / "w.safetensors")
    rng, inputs = np.random.default_rng(1), {}
    for batch, seq in ((1, 1), (3, 5), (1, 21)):
        x, mask = rng.normal(size=(batch, seq, 8)), np.ones((batch, seq), bool)
        mask[-1, :seq // 2] = False  # padding on the left of the last row (none where seq is 1)
        inputs[str(folder / f"{batch}x{seq}.npz")] = x, mask
        np.savez(folder / f"{batch}x{seq}.npz", x=x.astype(np.float32), mask=mask)
    out = subprocess.run([sys.executable, "-c", target.runner + RUN, str(folder / f"block{target.suffix}"), *inputs],
                         capture_output=True, text=True, check=True)
    report = json.loads(out.stdout.splitlines()[-1])
    assert report["loaded"] == []
    for name, (x, mask) in inputs.items():
        want = R.ode_block(params, x, CONFIG, mask)
        e32 = relative_error(R.ode_block(params, x.astype(np.float32), CONFIG, mask), want)
        assert relative_error(np.asarray(report["outputs"][name]), want) <= tolerance(e32, "float32"), name


def test_fuzz_judges_the_artifact_records_its_runtime_and_catches_other_weights(written, capsys, refused_in_one_line):
    """fuzz --model --runtime T: drawn inputs judged against the spec, the report naming the
    artifact's sha256 and its runtime's version; the same artifact judged against other weights
    diverges (exit 1); an artifact given to another runtime, a config that is not the artifact's
    and a file that is none are refused in one line. An ExecuTorch program's runner refuses a
    sequence past its planned memory (export.PastBounds, which fuzz counts as not supported)."""
    target, folder, _ = written
    model = folder / f"block{target.suffix}"
    if target.name == "executorch":
        from odeattn.export import PastBounds
        from odeattn.export.executorch_program import MAX_BATCH, MAX_SEQ, executorch_runner

        with pytest.raises(PastBounds, match=rf"^x: 1 x {MAX_SEQ + 1} tokens; the program's memory is planned for "
                                             rf"batch <= {MAX_BATCH} and seq <= {MAX_SEQ}$"):
            executorch_runner(model.read_bytes())(np.zeros((1, MAX_SEQ + 1, 8), np.float32))
    argv = ["conformance", "fuzz", "--model", str(model), "--config", str(folder / "config.json"),
            "--weights", str(folder / "w.safetensors"), "--runtime", target.name, "--examples", "20"]
    assert main([*argv, "--repro", str(folder / "r0"), "--json", str(folder / "r.json")]) == 0
    artifact = json.loads((folder / "r.json").read_text())["artifact"]
    assert artifact == {"file": model.name, "sha256": hashlib.sha256(model.read_bytes()).hexdigest(),
                        "runtime": target.name, "runtime_version": importlib.metadata.version(target.package)}
    R.save_params(R.init_params(CONFIG, seed=1, perturb_norms=True), folder / "other.safetensors")
    assert main([*argv[:7], str(folder / "other.safetensors"), *argv[8:], "--repro", str(folder / "r1")]) == 1
    other = folder / "other.json"
    other.write_text(json.dumps({**CONFIG.to_dict(), "ode_steps": 3}))
    capsys.readouterr()
    for changed, message in (({9: "onnxruntime"}, f"is a {target.suffix} file, which --runtime {target.name} runs; got --runtime onnxruntime"),
                             ({5: str(other)}, "--config: expected the config the file was exported with; differs at ode_steps=3"),
                             ({3: str(folder / "config.json")}, {"aoti": "expected an AOTInductor .pt2 package",
                                                                  "executorch": "expected an ExecuTorch .pte program"}[target.name])):
        refused_in_one_line([*argv, "--repro", str(folder / "r2")], changed, message)


def test_a_program_s_bounds_and_inputs_are_checked_before_it_runs(monkeypatch):
    """fuzz --model's adapter: a draw past an ExecuTorch program's bounds is not supported (not a
    failure); the runner refuses another width, a mask of another shape, and padding for a program
    without a mask input, each naming the input (a stub program: no build)."""
    from odeattn.conformance.adapters.protocol import NotSupported
    from odeattn.conformance.fuzzing.model_file import PackageFile
    from odeattn.export import PastBounds, artifact_inputs

    class Stub:
        """A program past whose bounds the runner refuses (export.PastBounds), as ExecuTorchRunner does."""
        config, dtype, takes_mask, kind = CONFIG, "float32", True, "package"

        def __call__(self, x, padding_mask=None):
            if x.shape[0] > 2 or x.shape[1] > 16:
                raise PastBounds(f"x: {x.shape[0]} x {x.shape[1]} tokens; planned for batch <= 2 and seq <= 16")
            return x

    adapter = PackageFile.__new__(PackageFile)
    adapter.run = Stub()
    assert adapter.run_block(CONFIG, None, np.zeros((2, 16, 8)), None, "float32").shape == (2, 16, 8)
    for shape in ((3, 4, 8), (1, 17, 8)):
        with pytest.raises(NotSupported, match=rf"^not supported: {shape[0]} x {shape[1]} tokens; planned for batch <= 2"):
            adapter.run_block(CONFIG, None, np.zeros(shape), None, "float32")
    x = np.zeros((2, 3, 8))
    for args, message in (((np.zeros((2, 3, 6)), None), r"^x: expected \(batch, seq, 8\), the program's d_model; got shape \(2, 3, 6\)$"),
                          ((x, np.ones((2, 4), bool)), r"^padding_mask: expected x's \(batch, seq\) \(2, 3\); got shape \(2, 4\)$"),
                          ((x, np.array([[1, 1, 0]] * 2, bool)), r"^padding_mask: the program was exported without a padding mask")):
        with pytest.raises(ValueError, match=message):
            artifact_inputs(*args, d_model=8, dtype=np.float32, takes_mask=args[1] is None or args[1].shape != (2, 3))
    got, mask = artifact_inputs(x.astype(np.float64), None, d_model=8, dtype=np.float32, takes_mask=True)
    assert got.dtype == np.float32 and mask.all() and mask.shape == (2, 3)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_the_backend_passes_a_golden_block_case(target):
    """Its conformance row on the golden set's smallest block case (euler, one step): the case's
    block compiled in the worker and judged at z1. The whole set takes tens of seconds a case
    (docs/deployment.md)."""
    pytest.importorskip(target.package)
    assert main(["conformance", "--backend", target.name, "-j", "1", "--dtype", "float32",
                 "-k", "^block_derf_euler_encoder_float_nopad_s1_b2t5h2d8$"]) == 0
