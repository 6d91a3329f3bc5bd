"""The iree backend: the exported block, prefill and decode-step models imported by IREE's ONNX
importer and compiled for this CPU (export/iree_program.py, docs/deployment.md)."""

import pytest

pytest.importorskip("iree.compiler")
pytest.importorskip("iree.runtime")

import ode_ref as R
from odeattn.cli import main


def test_the_iree_backend_passes_a_cached_decoding_case():
    """Its conformance row on a padded cached decoding: the prefill and decode-step models, the
    step's scalar slot index among its inputs (the block model: the next test; the encoder stack's
    model runs through the same export and runner as OpenVINO's, whose test runs one). The whole
    set takes about 8 min on 2 cores, a compile of about 4 s a model (docs/deployment.md)."""
    assert main(["conformance", "--backend", "iree", "-j", "1", "-k", "^decode_rk4_layer_norm_rope_pad$"]) == 0


def test_the_command_s_module_runs_through_iree_alone_at_any_batch_and_sequence(tmp_path, capsys, monkeypatch, runs_alone):
    """`odeattn export --target iree` writes a .vmfb checked against the spec (a batch padded on
    the right, then on the left), refusing the ONNX file's options in one line; the module keeps the file's dynamic batch and sequence: a fresh
    process that imports only NumPy and IREE's runtime gives z(1) within the suite's float32 rule
    at two shapes, neither the check's."""
    import json

    from odeattn.export import iree_program, standalone

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, mode="decoder", ode_use_pe=True, positional_encoding="rope")
    params = R.init_params(cfg, seed=0, perturb_norms=True)
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_dict()))
    R.save_params(params, tmp_path / "w.safetensors")
    argv = ["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "w.safetensors"),
            "--target", "iree", "-o", str(tmp_path / "block.vmfb")]
    for extra, message in ((["--opset", "23"], "--opset: applies to --target onnx"),
                           (["--functions"], "--functions: applies to --target onnx"),
                           (["--max-positions", "8"], "--max-positions: applies to --target jax")):
        assert main([*argv, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("odeattn export: ") and message in err and "\n" not in err
    assert main(argv) == 0 and "IREE module for this CPU" in capsys.readouterr().out
    # that module off by 1e-3 where a row is padded on the left: exit 1, nothing written
    vmfb, runner = (tmp_path / "block.vmfb").read_bytes(), iree_program.IreeRunner
    monkeypatch.setattr(iree_program, "compile_iree", lambda model: vmfb)
    monkeypatch.setattr(iree_program, "IreeRunner",
                        lambda b, d: lambda x, m: runner(b, d)(x, m) * (1.001 if not m[:, 0].all() else 1))
    assert main([*argv[:-1], str(tmp_path / "other.vmfb")]) == 1 and not (tmp_path / "other.vmfb").exists()
    assert "over float32's tolerance" in capsys.readouterr().err
    runs_alone(standalone.__file__, "from standalone import load; np.save('z.npy', load('iree', open('block.vmfb', "
               "'rb').read(), ['x', 'padding_mask'], ['z'])({'x': np.load('x.npy'), 'padding_mask': np.load('mask.npy')})['z'])",
               cfg, params)


def test_fuzz_judges_the_module_itself_and_records_the_runtime(tmp_path, capsys):
    """fuzz --model block.vmfb --runtime iree: the module as `odeattn export --target iree` writes
    it, loaded once by IREE's runtime, its drawn inputs judged against the spec; the report names the
    module by its sha256 and IREE's runtime by its version. An ONNX file for --runtime iree, and a
    config of another width (a module records none), are refused in one line."""
    import hashlib
    import importlib.metadata
    import json

    from safetensors.numpy import save_file

    from odeattn.export.block import export_model
    from odeattn.export.iree_program import compile_iree

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, mode="decoder")
    params = R.init_params(cfg, seed=2)
    (tmp_path / "c.json").write_text(json.dumps(cfg.to_dict()))
    wide = R.ODEConfig(**{**cfg.to_dict(), "hidden_size": 12})
    (tmp_path / "wide.json").write_text(json.dumps(wide.to_dict()))
    save_file(params, str(tmp_path / "w.safetensors"))
    save_file(R.init_params(wide), str(tmp_path / "wide.safetensors"))
    model = export_model(cfg, params)
    (tmp_path / "block.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "block.vmfb").write_bytes(compile_iree(model))
    argv = ["conformance", "fuzz", "--runtime", "iree", "--examples", "3", "--repro", str(tmp_path / "repro")]
    for model_file, block, message in (("block.onnx", "c", "expected a .vmfb file for --runtime iree; got the ONNX file"),
                                       ("block.vmfb", "wide", "it takes no x of width 12, the config's hidden_size")):
        assert main([*argv, "--model", str(tmp_path / model_file), "--config", str(tmp_path / f"{block}.json"),
                     "--weights", str(tmp_path / f"{'w' if block == 'c' else block}.safetensors")]) == 2
        line, = capsys.readouterr().err.strip().splitlines()
        assert message in line, line
    assert main([*argv, "--model", str(tmp_path / "block.vmfb"), "--config", str(tmp_path / "c.json"),
                 "--weights", str(tmp_path / "w.safetensors"), "--json", str(tmp_path / "r.json")]) == 0
    artifact = json.loads((tmp_path / "r.json").read_text())["artifact"]
    assert artifact["sha256"] == hashlib.sha256((tmp_path / "block.vmfb").read_bytes()).hexdigest()
    assert (artifact["runtime"], artifact["runtime_version"]) == ("iree", importlib.metadata.version("iree-base-runtime"))
