"""`odeattn conformance fuzz`: the planted kernel bugs caught, shrunk and localised at the default
budget and seed; the spec against itself with no false alarm; the repro folder replayed; bad input
refused in one line, exit 2."""

import hashlib
import json
import re

import numpy as np
import pytest

import ode_ref as R
from odeattn.cli import main
from odeattn.conformance.mutation import planted
from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.fuzzing.draw import Draw, build
from odeattn.conformance.running.compare import run_case
from odeattn.conformance.fuzzing.fuzz import DEFAULT_EXAMPLES, Finding, explain, fuzz
from odeattn.conformance.cases.localise import describe, off_elements
from odeattn.conformance.fuzzing.repro import load_repro, write_repro


def off_slots(finding, axis):
    """The indices along axis (0: batch rows, 1: token slots) of the divergent quantity's off elements."""
    q = finding.quantity
    tol = next(r.tolerance for r in finding.result.quantities if r.quantity == q)
    bad = off_elements(finding.outputs[q], finding.case.quantities()[q], tol)
    other = tuple(a for a in range(bad.ndim) if a != axis)
    return np.flatnonzero(bad.any(axis=other))


def _tile(f):
    assert off_slots(f, 1).min() >= planted.TILE and f.case.x.shape[1] > planted.TILE
    assert "≥ 16" in f.localisation["positions"] or "position 16" in f.localisation["positions"]


def _chunk(f):
    assert off_slots(f, 0).min() >= planted.CHUNK
    assert "≥ 4" in f.localisation["rows"] or re.search(r"\brows? 4\b", f.localisation["rows"])


def _head_width(f):
    d = f.case.config.head_dim
    assert d % planted.LANES == 0 and d >= 2 * planted.LANES
    assert f.localisation["positions"] == "every token"


def _table(f):
    assert {"ode_use_pe", "positional encoding"} & set(f.essence.needed)  # the rotation: what the bug needs
    start = int(f.quantity.split("_")[1]) + f.case.prompt - 1 if f.quantity.startswith("decode_") else 0
    assert (off_slots(f, 1) + start).min() >= planted.TABLE
    assert "32" in f.localisation["positions"]


def _offset(f):  # the cancellation's error differs from token to token: some may stay within tolerance
    assert f.draw.offset != 0 and f.case.config.norm_type == "layer_norm" and f.essence.needed == ["offset"]


# shrunk: whether seed 0's first divergent example is larger than the minimal one. For PositionTable and
# OffsetInput it is not: the covering array's cell that first fails is already at its levels' least
# sizes, and no smaller failure turns up in the random draws after it; the test then requires that
# shrinking kept it, reduced to its essence.
@pytest.mark.parametrize("port, region, shrunk", [(planted.TileBoundary, _tile, True), (planted.BatchChunk, _chunk, True),
                                                  (planted.HeadWidthFastPath, _head_width, True),
                                                  (planted.PositionTable, _table, False), (planted.OffsetInput, _offset, False)],
                         ids=lambda p: getattr(p, "__name__", ""))
def test_a_planted_kernel_bug_is_caught_shrunk_and_localised(port, region, shrunk):
    run = fuzz(port(), "float32", examples=DEFAULT_EXAMPLES, seed=0)
    f = run.finding
    assert f is not None, f"{port.__name__} survived {run.examples} examples"
    if shrunk:
        assert f.draw.size() < f.first.size(), "the shrunk example is not smaller than where it was first found"
    else:
        assert f.draw.size() <= f.first.size() and run.found_in.startswith("row") and f.essence.needed
    region(f)


@pytest.mark.parametrize("port", planted.PLANTED, ids=lambda p: p.__name__)
def test_a_planted_port_is_exact_inside_the_golden_shapes(port, golden_block_sample):
    for case in golden_block_sample:
        assert run_case(port(), case, "float64").status == "passed", case.name


@pytest.fixture(scope="session")
def golden_block_sample():
    from odeattn.conformance.golden import load_cases

    from odeattn.conformance.cases import TIER_CASES

    tier = {name for name, *_ in TIER_CASES}  # the kernel-boundary tier catches each (test_golden)
    cases = [c for c in load_cases() if c.name.startswith(("block_", "decode_")) and c.name not in tier]
    return cases[::4]


def _finding(port):
    d = Draw("block", R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder"), 2, 17, (("right", 3), ("none", 1)), 1.0, 0.0, 1, 2)
    case = build(d, "float32")
    outputs = {}
    result = run_case(port, case, "float32", outputs=outputs)
    return explain(Finding(d, case, result, outputs, first=d), port, "float32")


def test_the_minimal_example_says_whether_shrinking_changed_its_sizes():
    """An example shrinking left at its sizes is said so, not "shrunk from seq 17 to seq 17"."""
    import dataclasses

    from odeattn.conformance.fuzzing.fuzz_report import format_finding

    f = _finding(planted.TileBoundary())
    assert format_finding(f).splitlines()[0] == (
        "  minimal example (a block forward), batch 2, seq 17, d_model 8, 2 steps, not shrunk further in size:")
    f.first = dataclasses.replace(f.draw, seq=33)
    assert format_finding(f).splitlines()[0] == ("  minimal example (a block forward), shrunk from batch 2, seq 33, "
                                                 "d_model 8, 2 steps to batch 2, seq 17, d_model 8, 2 steps:")


def test_a_repro_folder_replays_its_example(tmp_path):
    port = planted.TileBoundary()
    f = _finding(port)
    assert f.quantity == "f0" and f.stage["stage"] == "attn"
    write_repro(tmp_path / "r", f, "odeattn.conformance.mutation.planted:TileBoundary", "float32")
    meta = json.loads((tmp_path / "r" / "case.json").read_text())
    assert meta["command"].startswith("odeattn conformance fuzz --replay ") and meta["quantity"] == "f0"
    case, _ = load_repro(tmp_path / "r")
    np.testing.assert_array_equal(case.x, f.case.x)
    assert run_case(port, case, "float32").status == "failed"
    assert main(["conformance", "fuzz", "--replay", str(tmp_path / "r"), "--backend", "odeattn.conformance.mutation.planted:TileBoundary"]) == 1
    assert main(["conformance", "fuzz", "--replay", str(tmp_path / "r"), "--backend", "spec", "--dtype", "float64"]) == 0


def _repro(tmp_path, spoil=None):
    write_repro(tmp_path / "r", _finding(planted.TileBoundary()), "spec", "float32")
    if spoil:
        spoil(tmp_path / "r")
    return str(tmp_path / "r")


@pytest.mark.parametrize("argv, spoil, message", [
    (["--examples", "0", "--backend", "spec"], None, "--examples: expected an integer >= 1; got '0'"),
    (["--backend", "spec", "-k", "x"], None, "-k: not taken by fuzz"),
    (["--backend", "spec", "--time-budget", "1e-9"], None,
     "--time-budget: 1e-09 s ran out before any example ran on spec in float64: nothing was judged, which is not a pass"),
    (["--dtype", "float64"], None, "--backend: fuzz needs a backend"),
    (["--backend", "spec", "--dtype", "float32"], None, "--dtype: no backend runs any of the dtypes asked for (float32)"),
    (["--model", "{r}/none.onnx"], None, "--model: takes --config and --weights"),
    (["--model", "{r}/none.onnx", "--config", "{r}/config.json", "--weights", "{r}/weights.safetensors", "--runtime", "onnxruntime-deno"],
     None, "--runtime: expected one of onnxruntime, onnxruntime-node, onnxruntime-web, openvino, iree, tract, aoti, executorch, jax, litert; "
           "got 'onnxruntime-deno'"),
    (["--replay", "{r}", "--backend", "spec"], lambda d: (d / "x.npy").unlink(), "is missing x.npy"),
    (["--replay", "{r}", "--backend", "spec"],
     lambda d: np.save(d / "padding_mask.npy", np.array([{}], dtype=object), allow_pickle=True), "padding_mask.npy holds a pickle"),
    *[(["--replay", "{r}", "--backend", "spec", option, value], None,
       f"{option}: not taken with --replay (it reruns one example, drawing nothing)")
      for option, value in (("--examples", "5"), ("--seed", "1"), ("--time-budget", "5"))],
    *[(["--replay", "{r}", "--backend", "spec", option, value], None,
       f"{option}: not taken with --replay (it prints the one example's result and writes no file)")
      for option, value in (("--json", "{r}/f.json"), ("--junit", "{r}/f.xml"), ("--repro", "{r}/again"))],
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, argv, spoil, message):
    r = _repro(tmp_path, spoil) if "{r}" in argv else ""
    with pytest.raises(SystemExit) as exit_:
        code = main(["conformance", "fuzz", *[a.replace("{r}", r) for a in argv]])
        raise SystemExit(code)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and message in err and len(err.splitlines()) == 1, err


ZEROS = """
import numpy as np

from odeattn.conformance.adapters import SpecAdapter


class Zeros(SpecAdapter):
    name, dtypes = "zeros", ("float32", "float64")
    run_func = run_trajectory = run_stages = None

    def run_block(self, config, params, x, padding_mask, dtype):
        return np.zeros_like(x)
"""


def _scaled(folder, at=None, by=1.0):
    x = np.load(folder / "x.npy")
    if at is not None:
        x[at] = np.inf
    np.save(folder / "x.npy", x * by)


@pytest.mark.parametrize("spoil, message", [
    (lambda d: _scaled(d, at=(0, 1, 2)), "--replay: x.npy holds inf at [0, 1, 2]; expected finite values: nothing can be "
                                         "judged on it, which is not a pass"),
    (lambda d: _scaled(d, by=1e39), "--replay: the spec's own float32 error on f0 is nan on this input (x.npy's values "
                                    "reach"),
], ids=["inf", "overflowing-float32"])
def test_a_replayed_input_with_no_finite_reference_or_tolerance_is_refused(tmp_path, capsys, monkeypatch, spoil, message):
    """A port answering zeros fails the folder's example; once its input is not finite, or
    overflows float32 (whose error sets the tolerance), error > tolerance is False for any answer:
    the replay refuses it in one line, exit 2, as the golden set refuses a non-finite golden."""
    (tmp_path / "zeros_port.py").write_text(ZEROS)
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = _repro(tmp_path)
    argv = ["conformance", "fuzz", "--replay", folder, "--backend", "zeros_port:Zeros"]
    assert main(argv) == 1
    capsys.readouterr()
    spoil(tmp_path / "r")
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert captured.out == "" and len(lines) == 1 and lines[0].startswith(f"odeattn conformance fuzz: {message}"), captured


def _cut(path, keep):
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize("spoil, message", [
    pytest.param(lambda d: _cut(d / "weights.safetensors", 100), "--replay: weights.safetensors: not a readable "
                 "safetensors file (Error while deserializing header", id="weights-truncated"),
    pytest.param(lambda d: _cut(d / "weights.safetensors", 0), "--replay: weights.safetensors: not a readable "
                 "safetensors file", id="weights-empty"),
    pytest.param(lambda d: (d / "weights.safetensors").write_bytes(__import__("pickle").dumps({"w": [1.0]})),
                 "--replay: weights.safetensors: not a readable safetensors file", id="weights-a-pickle"),
    pytest.param(lambda d: _cut(d / "x.npy", 0), "--replay: x.npy: expected a .npy array; the file is empty", id="x-empty"),
    pytest.param(lambda d: _cut(d / "x.npy", 150), "--replay: x.npy: a damaged .npy file (Failed to read all data",
                 id="x-truncated"),
    pytest.param(lambda d: (d / "case.json").write_text("[" * 200_000 + "]" * 200_000),
                 "--replay: case.json: not valid JSON (nested too deep to parse)", id="case-nested-200000-deep"),
    pytest.param(lambda d: (d / "config.json").write_text("{\"a\":" * 200_000 + "1" + "}" * 200_000),
                 "--replay: config.json: not valid JSON (nested too deep to parse)", id="config-nested-200000-deep"),
    pytest.param(lambda d: (d / "case.json").write_bytes(b"\xff\xfe{"), "--replay: case.json: not valid JSON ('utf-8' codec",
                 id="case-not-utf8"),
    pytest.param(lambda d: (d / "config.json").write_text("[]"), "--replay: config.json: hidden_size: required",
                 id="config-a-list"),
    pytest.param(lambda d: (d / "case.json").write_text(json.dumps({**json.loads((d / "case.json").read_text()), "decoded": "2"})),
                 "--replay: case.json: expected decoded an integer in [0, 16] (tokens after the prompt, of seq 17); got '2'",
                 id="decoded-a-string"),
])
def test_a_damaged_repro_folder_is_one_line_naming_the_file(tmp_path, capsys, spoil, message):
    """Each damaged file of a repro folder is refused in one line naming it, exit 2, where a
    dependency's exception (SafetensorError, EOFError, RecursionError, ...) would end the replay."""
    code = main(["conformance", "fuzz", "--replay", _repro(tmp_path, spoil), "--backend", "spec", "--dtype", "float64"])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and captured.out == "", captured
    assert lines[0].startswith(f"odeattn conformance fuzz: {message}"), lines


def _damaged_model(kind, tmp_path):
    """(the .onnx path, --config, --weights) of a block file spoilt as kind says, written under tmp_path."""
    import onnx
    from onnx import helper
    from safetensors.numpy import save_file

    from odeattn.export.block import export_model

    fields = dict(hidden_size=8, num_heads=2, mode="decoder")
    config = R.ODEConfig(**fields)
    params = R.init_params(config, seed=3)
    (tmp_path / "c.json").write_text(json.dumps(fields) if kind != "config-nested-200000-deep" else "[" * 200_000 + "]" * 200_000)
    save_file(params, str(tmp_path / "w.safetensors"))
    model, path = export_model(config, params), tmp_path / "m.onnx"
    if kind == "custom-op-domain":  # z passed through an operator of a domain ONNX Runtime does not have
        z = next(n for n in model.graph.node if "z" in n.output)
        z.output[:] = ["z_before"]
        model.graph.node.append(helper.make_node("Rescale", ["z_before"], ["z"], domain="com.example.ops"))
        model.opset_import.append(helper.make_opsetid("com.example.ops", 1))
    if kind == "external-data-outside-its-folder":  # the weights saved beside, then pointed one folder up
        (tmp_path / "sub").mkdir()
        path = tmp_path / "sub" / "m.onnx"
        onnx.save_model(model, str(path), save_as_external_data=True, location="w.bin", size_threshold=0)
        model = onnx.load(str(path), load_external_data=False)
        for t in model.graph.initializer:
            for entry in t.external_data:
                entry.value = "../w.bin" if entry.key == "location" else entry.value
        (tmp_path / "w.bin").write_bytes((tmp_path / "sub" / "w.bin").read_bytes())
    data = model.SerializeToString()
    path.write_bytes({"truncated": data[:len(data) // 2], "not-onnx": b"\x89PNG\r\n\x1a\n"}.get(kind, data))
    return [str(path), str(tmp_path / "c.json"), str(tmp_path / "w.safetensors")]


DAMAGED_MODEL = {
    "truncated": "--model: model '{m}': not an ONNX model (it does not parse as one",
    "not-onnx": "--model: model '{m}': not an ONNX model (it does not parse as one",
    "custom-op-domain": "--model: model '{m}': uses the operator com.example.ops:Rescale of a custom-op domain, "
                        "which ONNX Runtime runs only with that domain's library registered",
    "external-data-outside-its-folder": "--model: model '{m}': its external data is refused (Data of TensorProto",
    "config-nested-200000-deep": "--config '{c}': not valid JSON (nested too deep to parse)",
}


@pytest.mark.parametrize("kind", DAMAGED_MODEL)
def test_a_damaged_model_file_or_config_is_one_line_naming_it(tmp_path, capsys, kind):
    """fuzz --model on a file cut short, not ONNX, calling a custom-op domain or reading external
    data outside its folder, or with a --config nested 200,000 deep: one line naming the file,
    exit 2, before any example is drawn (where protobuf's DecodeError, ONNX Runtime's Fail or a
    RecursionError would end it)."""
    pytest.importorskip("onnxruntime")
    model, config, weights = _damaged_model(kind, tmp_path)
    line = _refused_before_any_draw(tmp_path, capsys, model, config, weights)
    assert line.startswith("odeattn conformance fuzz: " + DAMAGED_MODEL[kind].format(m=model, c=config)), line


def _refused_before_any_draw(tmp_path, capsys, model, config, weights) -> str:
    """The one line of a fuzz --model refused as a usage error (exit 2), nothing on stdout and no
    repro folder made."""
    code = main(["conformance", "fuzz", "--model", model, "--config", config, "--weights", weights,
                 "--examples", "2", "--repro", str(tmp_path / "repro")])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and captured.out == "", captured
    assert not (tmp_path / "repro").exists()
    return lines[0]


NOTHING_RUNS = """
from odeattn.conformance.adapters import SpecAdapter


class NothingRuns(SpecAdapter):
    name = "nothing-runs"
    dtypes = ("float64",)
    run_decode = run_vjp = None

    def supports(self, config, dtype):
        return "not supported: every config"
"""


def test_a_backend_that_runs_no_drawn_config_is_not_a_pass(capsys, monkeypatch, tmp_path):
    (tmp_path / "fuzz_nothing_runs.py").write_text(NOTHING_RUNS)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["conformance", "fuzz", "--backend", "fuzz_nothing_runs:NothingRuns", "--examples", "5"]) == 2
    assert "ran none of the drawn configs" in capsys.readouterr().err


def test_describe_names_the_region():
    assert describe(range(16, 20), 20, "query position", "query positions") == "only query positions ≥ 16 (of 20)"
    assert describe(range(0, 20), 20, "batch row") == "every batch row"
    assert describe([4], 5, "batch row") == "only batch row 4 (of 5)"


def test_a_model_file_is_judged_on_drawn_inputs_and_a_wrong_one_caught(tmp_path, capsys):
    pytest.importorskip("onnxruntime")
    from safetensors.numpy import save_file

    from odeattn.export.block import export_model

    fields = dict(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True)
    config = R.ODEConfig(**fields)
    params = R.init_params(config, seed=3, perturb_norms=True)
    (tmp_path / "c.json").write_text(json.dumps(fields))
    save_file(params, str(tmp_path / "w.safetensors"))
    (tmp_path / "block.onnx").write_bytes(export_model(config, params).SerializeToString())
    argv = ["conformance", "fuzz", "--model", str(tmp_path / "block.onnx"), "--config", str(tmp_path / "c.json"),
            "--examples", "8", "--repro", str(tmp_path / "repro")]
    assert main([*argv, "--weights", str(tmp_path / "w.safetensors")]) == 0
    other = {k: v * 1.01 if k.endswith("qkv.weight") else v for k, v in params.items()}  # weights other than the file's
    save_file(other, str(tmp_path / "other.safetensors"))
    assert main([*argv, "--weights", str(tmp_path / "other.safetensors")]) == 1
    assert "minimal example" in capsys.readouterr().out
    folder, = (tmp_path / "repro").iterdir()
    command = json.loads((folder / "case.json").read_text())["command"].split()
    assert command[:5] == ["odeattn", "conformance", "fuzz", "--replay", str(folder)] and "--model" in command
    assert main(command[1:]) == 1  # the file against the spec on other weights: still off
    capsys.readouterr()
    save_file({k: v * 1e200 for k, v in params.items()}, str(tmp_path / "huge.safetensors"))  # beyond what the file holds
    assert main([*argv, "--weights", str(tmp_path / "huge.safetensors"), "--repro", str(tmp_path / "r2")]) == 2
    assert capsys.readouterr().err == ("odeattn conformance fuzz: --weights: the model file runs in float32, which holds "
                                       "magnitudes up to 3.403e+38; got a weight of magnitude 1.489e+200\n")


def _not_a_block(kind, tmp_path):
    """(the .onnx file, --config, --weights) of a file fuzz --model does not judge, as a user has them."""
    from safetensors.numpy import save_file

    from odeattn.export import block, deploy, genai

    fields = dict(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True)
    config = R.ODEConfig(**fields)
    params = R.init_params(config, seed=3)
    if kind == "genai":  # the GenAI folder's model and its LMConfig, whose keys no block config has
        config = R.LMConfig(vocab_size=16, num_layers=1, hidden_size=8, num_heads=2, ode_steps=1)
        params = R.init_lm_params(config, seed=0)
        model, fields = genai.export_genai_model(config, params), config.to_dict()
    elif kind == "int8-without-its-metadata":  # quantize_dynamic's file as a user writes it: only the ops tell
        model = deploy.quantize_int8(block.export_model(config, params))
        del model.metadata_props[:]
    else:
        model = {"prefill": block.export_prefill_model, "decode-step": block.export_decode_model,
                 "int8": lambda c, p: deploy.quantize_int8(block.export_model(c, p))}[kind](config, params)
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    (tmp_path / "c.json").write_text(json.dumps(fields))
    save_file(params, str(tmp_path / "w.safetensors"))
    return [str(tmp_path / n) for n in ("m.onnx", "c.json", "w.safetensors")]


@pytest.mark.parametrize("kind, message", [
    ("prefill", "is not a block model (the prefill model of cached decoding, which the suite's --backend onnxruntime "
                "judges on its decode cases): expected the inputs x and, where exported with them, padding_mask and "
                "steps; found max_len, padding_mask, x"),
    ("decode-step", "is not a block model (the decode-step model of cached decoding, which the suite's --backend "
                    "onnxruntime judges on its decode cases): expected the inputs x and, where exported with them, "
                    "padding_mask and steps; found index, padding_mask, past_key_0,"),
    ("genai", "is an ONNX Runtime GenAI model (inputs attention_mask, input_ids, past_key_values.0.key, "
              "past_key_values.0.value, past_key_values.1.key, past_key_values.1.value, ... (10 in all)), not a block "
              "model; GenAI's folder is checked against the spec by odeattn.conformance.genai.check_genai"),
    ("int8", "is int8-quantised (DynamicQuantizeLinear): lossy, so not judged at float32's tolerance; its error "
             "against the spec is bounded by odeattn.export.deploy.int8_error_bound only for reduce_range files"),
    ("int8-without-its-metadata", "is int8-quantised (DynamicQuantizeLinear): lossy"),
])
def test_a_file_that_is_no_float_block_model_is_refused_in_one_line_before_any_draw(tmp_path, capsys, kind, message):
    """A prefill, decode-step, GenAI or int8 file is a usage error (exit 2) naming what the file is,
    before its config is read (a GenAI one's is an LMConfig) and before any example or repro folder."""
    pytest.importorskip("onnxruntime")
    model, config, weights = _not_a_block(kind, tmp_path)
    line = _refused_before_any_draw(tmp_path, capsys, model, config, weights)
    assert line.startswith(f"odeattn conformance fuzz: --model: {model!r} {message}"), line


@pytest.mark.parametrize("runtime", ["onnxruntime-node", "onnxruntime-web", "openvino", "tract"])
def test_a_model_file_is_judged_in_another_runtime_down_to_its_stage(tmp_path, capsys, runtime):
    """--runtime runs the file in ONNX Runtime's JavaScript build (its worker on Node.js), in
    OpenVINO or in tract; a file exported with the stage outputs names the first divergent stage, here q of
    weights 1% off."""
    from odeattn.conformance.adapters import missing_requirements

    if missing_requirements(runtime):
        pytest.skip(f"{runtime}: missing {', '.join(missing_requirements(runtime))}")
    from safetensors.numpy import save_file

    from odeattn.export.block import export_model

    fields = dict(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True)
    config = R.ODEConfig(**fields)
    params = R.init_params(config, seed=3, perturb_norms=True)
    (tmp_path / "c.json").write_text(json.dumps(fields))
    save_file(params, str(tmp_path / "w.safetensors"))
    save_file({k: v * 1.01 if k.endswith("qkv.weight") else v for k, v in params.items()}, str(tmp_path / "other.safetensors"))
    (tmp_path / "block.onnx").write_bytes(export_model(config, params, diagnostics=True, stages=True).SerializeToString())
    argv = ["conformance", "fuzz", "--model", str(tmp_path / "block.onnx"), "--config", str(tmp_path / "c.json"),
            "--runtime", runtime, "--examples", "4", "--repro", str(tmp_path / "repro")]
    if runtime != "onnxruntime-web":  # onnxruntime-web's worker takes seconds to start: its run is the divergent one only
        assert main([*argv, "--weights", str(tmp_path / "w.safetensors")]) == 0
        assert f"model:block.onnx@{runtime}/float32: 4 examples, none diverged" in capsys.readouterr().out
    assert main([*argv, "--weights", str(tmp_path / "other.safetensors"), "--json", str(tmp_path / "r.json")]) == 1
    assert "stage:    first divergent stage of f(0, x): q, q after preprocess_qkv (norm agree)" in capsys.readouterr().out
    folder, = (tmp_path / "repro").iterdir()
    assert json.loads((folder / "case.json").read_text())["command"].endswith(f"--runtime {runtime}")
    report = json.loads((tmp_path / "r.json").read_text())
    judged = report["runs"][0]["judged"]  # each example's verdict and err/tol, the divergent ones among them
    assert len(judged) == report["runs"][0]["examples"] and any(j["status"] == "failed" and j["worst_ratio"] > 1 for j in judged)
    artifact = report["artifact"]  # what a deployer ships beside the file
    assert artifact["sha256"] == hashlib.sha256((tmp_path / "block.onnx").read_bytes()).hexdigest()
    assert (artifact["file"], artifact["runtime"]) == ("block.onnx", runtime) and artifact["runtime_version"][0].isdigit()


def test_the_pytest_plugin_adds_golden_and_fuzz_items(tmp_path):
    """The installed entry point (pytest11) gives a port author's suite the items (the block's fuzz item and the
    encoder stack's); a fuzz failure names its repro folder and where it was drawn."""
    import subprocess
    import sys

    (tmp_path / "test_mine.py").write_text("def test_mine():\n    pass\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--odeattn-backend",
                           "odeattn.conformance.mutation.planted:BatchChunk", "--odeattn-dtype", "float64", "--odeattn-examples", "40",
                           "--odeattn-no-cover", "-k", "mine or fuzz or block_t1", "--basetemp", str(tmp_path / "base"), str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert "1 failed, 3 passed" in done.stdout, done.stdout + done.stderr  # the encoder stack's item passes: the bug is the block's
    assert "odeattn[planted-BatchChunk/float64/fuzz]" in done.stdout and "odeattn-fuzz-repro" in done.stdout
    assert "found in the random draws" in done.stdout  # --odeattn-no-cover: no covering array first


@pytest.mark.parametrize("name", ["spec", "torch", "jax", "flax", "onnxruntime", "onnxruntime-opset23", "onnxruntime-loop",
                                  "onnx-reference"])
def test_each_port_s_stages_agree_with_the_spec_s_and_a_planted_bug_is_named_at_attn(name, builtin_adapter):
    from ode_ref.recording import STAGES
    from odeattn.conformance.adapters import missing_requirements
    from odeattn.conformance.fuzzing.draw import case_of
    from odeattn.conformance.fuzzing.stages import first_divergent_stage

    if missing_requirements(name):
        pytest.skip(f"{name} is not installed")
    config = R.ODEConfig(hidden_size=64, num_heads=2, ode_use_pe=True, mode="decoder")
    params = R.init_params(config, seed=1, perturb_norms=True)
    case = case_of(config, params, np.random.default_rng(0).normal(size=(2, 20, 64)), None, kind="block")
    stage = first_divergent_stage(builtin_adapter(name), case, "float32")
    assert stage["stage"] is None and stage["agree"] == list(STAGES), stage
    bad = first_divergent_stage(planted.TileBoundary(), case, "float32")
    assert bad["stage"] == "attn" and bad["localisation"]["positions"] == "only query positions ≥ 16 (of 20)"


def test_a_draw_with_no_meaning_in_a_half_dtype_is_not_run_and_not_a_divergence(monkeypatch):
    """A grad draw in bfloat16 has no meaning under the half policy (half.py's rules): run_case
    marks it untestable without running the backend, as the golden runner does, and a fuzz run
    in bfloat16 counts such draws as skipped, never as a counterexample, without the spec
    building their cases (a grad draw is untestable in a half dtype whatever its input)."""
    from odeattn.conformance.fuzzing import fuzz as fuzzing

    d = Draw("grad", R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder"), 1, 5, None, 1.0, 0.0, 1, 2)
    case = build(d, "bfloat16")
    assert case.untestable("bfloat16") is not None
    outputs = {}
    result = run_case(SpecAdapter(), case, "bfloat16", outputs=outputs)
    assert (result.status, outputs) == ("untestable", {})
    built = []
    monkeypatch.setattr(fuzzing, "build", lambda d, *a, **kw: built.append(d.kind.name) or build(d, *a, **kw))
    run = fuzz(SpecAdapter(), "bfloat16", examples=15, seed=0)
    assert run.finding is None, run.finding.result.message
    assert run.skipped and built and "grad" not in built, (run.skipped, built)


def test_a_draw_s_fair_input_is_found_once_and_its_case_is_the_same(monkeypatch):
    """build remembers a drawn example's fair input (draw.FAIR_ATTEMPTS): built again, in another
    dtype, it is not checked again, and its case is the one the check gave, bit for bit; a draw
    remembered with no fair input is given up unbuilt."""
    from odeattn.conformance.fuzzing import draw as drawing

    monkeypatch.setattr(drawing, "FAIR_ATTEMPTS", {})
    d = Draw("block", R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", use_bitnet=True), 2, 9, None, 1.0, 0.0, 1, 2)
    first = build(d, "float32")
    assert drawing.FAIR_ATTEMPTS == {d: first.input_seed - d.input_seed}
    monkeypatch.setattr(drawing, "fair_inputs", lambda *args: pytest.fail("a remembered draw checked again"))
    again = build(d, "float64")
    assert again.e32 == first.e32 and np.array_equal(again.x, first.x)
    assert all(np.array_equal(again.quantities()[q], a) for q, a in first.quantities().items())
    unfair = Draw("block", d.config, 1, 9, None, 1.0, 0.0, 1, 3)
    drawing.FAIR_ATTEMPTS[unfair] = None
    assert build(unfair, "float32") is None


def test_the_backend_runs_on_one_thread_inside_fuzz():
    """Each draw's arrays are small: fuzz keeps OpenMP (torch's intra-op pool) to one thread while
    the backend runs, as NumPy's BLAS; a second thread only waits on the other core's work."""
    torch = pytest.importorskip("torch")
    seen = []

    class Counting(SpecAdapter):
        def run_trajectory(self, *args):
            seen.append(torch.get_num_threads())
            return super().run_trajectory(*args)

    fuzz(Counting(), "float64", examples=3, seed=0, kinds=("block",))
    assert seen and set(seen) == {1}, seen


class _VOff(R.SelfAttention):
    """v 1% off after preprocess_qkv: a stage bug an export carries (its nodes built from the variant)."""

    def preprocess_qkv(self, q, k, v, **kw):
        q, k, v = super().preprocess_qkv(q, k, v, **kw)
        return q, k, v * 1.01


@pytest.mark.parametrize("form", ["unrolled", "loop"])
def test_a_stage_bug_in_an_onnx_backend_is_named_at_its_stage_from_the_diagnostic_outputs(form):
    pytest.importorskip("onnxruntime")
    from odeattn.conformance.adapters import exported as X

    port = type("Planted", ({"unrolled": X.OnnxRuntimeAdapter, "loop": X.OnnxRuntimeLoopAdapter}[form],), {"variant": _VOff})()
    d = Draw("block", R.ODEConfig(hidden_size=16, num_heads=2, mode="decoder", ode_use_pe=True), 2, 5, (("right", 2), ("none", 1)),
             1.0, 0.0, 1, 2)
    f = explain(Finding(d, build(d, "float32"), run_case(port, build(d, "float32"), "float32", outputs=(outputs := {})), outputs, first=d), port, "float32")
    assert f.quantity == "f0" and f.stage["stage"] == "v" and f.stage["agree"] == ["norm", "q", "k"], f.stage
    assert f.stage["localisation"]["heads"] == "every head"


@pytest.mark.filterwarnings("ignore:Using `assume` outside")  # the probe called directly, as hypothesis would
def test_a_model_file_s_draw_whose_reference_overflows_is_refused_not_judged():
    """Weights in float32's range whose block still overflows on an input: the spec's reference is
    not finite, so nothing can be judged on it (error > tolerance would be False whatever the file
    gives); the draw is refused under its reason, and a run of such draws only is not a pass."""
    from hypothesis.errors import UnsatisfiedAssumption

    from odeattn.conformance.adapters import SpecAdapter
    from odeattn.conformance.fuzzing.draw import Draw
    from odeattn.conformance.fuzzing.fuzz import NO_FINITE_REFERENCE, FuzzRun, Probe

    config = R.ODEConfig(hidden_size=8, num_heads=2)
    huge = {k: v * 1e30 + 1e30 for k, v in R.init_params(config, seed=3).items()}
    run = FuzzRun("spec", "float32")
    probe = Probe(run, SpecAdapter(), params=huge, time_budget=None, shrink_seconds=60.0, database=None)
    with pytest.raises(UnsatisfiedAssumption):
        probe(Draw("block", config, 1, 3, None, 1.0, 0.0, 1, 2))
    assert run.refusals == {NO_FINITE_REFERENCE: 1} and run.examples == 0 and run.unfair == 1
