"""`odeattn conformance` on user errors: one line each, exit 2, before any case runs."""

import shutil

import pytest

from odeattn.conformance import golden
from odeattn.cli import main


@pytest.mark.parametrize("argv, message", [
    (["-k", "block_(derf"], "-k: invalid regular expression 'block_(derf'"),
    (["--exclude", "["], "--exclude: invalid regular expression '['"),
    (["--xfail", "spec/("], "--xfail: invalid regular expression 'spec/('"),
    (["--backend", "odeattn.conformance.adapters:Missing"], "--backend odeattn.conformance.adapters:Missing: cannot be loaded (AttributeError"),
    (["--backend", "no_such_module_anywhere:Backend"], "--backend no_such_module_anywhere:Backend: cannot be loaded (ModuleNotFoundError"),
    (["--backend", "tensorflow"], "--backend: expected one of spec, torch, jax"),
    (["--backend", "onnxruntime-int8"], "--backend onnxruntime-int8: not a conformance backend: int8 dynamic "
                                        "quantisation (odeattn export --quantize int8) is lossy"),
    (["--json", "{tmp}/missing/r.json"], "--json: the folder '{tmp}/missing' does not exist"),
    (["--junit", "{tmp}"], "--junit: expected a file path; got the folder '{tmp}'"),
    (["--junit", "/proc/r.xml"], "--junit: '/proc/r.xml' is not writable"),
    (["-k", "no-such-case"], "-k/--exclude: no case matches the patterns"),
    (["--expect-digest", "0" * 64], "--expect-digest: expected " + "0" * 64 + "; the golden set's digest is"),
    (["--golden", "{tmp}/nowhere"], "--golden: expected a folder; got '{tmp}/nowhere'"),
    (["--backend", "spec", "--backend", "spec"], "--backend: each backend once; got spec more than once"),
    (["--backend", ".relative:X"], "--backend .relative:X: expected an absolute module name"),
])
def test_usage_errors_exit_2_with_one_line(argv, message, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["conformance", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran: no header, no table
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("odeattn conformance: " + message.format(tmp=tmp_path)), lines


def test_a_bad_suite_file_exits_2_with_a_line_per_defect(tmp_path, capsys):
    shutil.copytree(golden.GOLDEN_DIR, tmp_path / "g")
    text = (tmp_path / "g" / "manifest.json").read_text()
    (tmp_path / "g" / "manifest.json").write_text(text.replace('"format": 4', '"format": "4"').replace('"padding": true', '"padding": 1', 1))
    (tmp_path / "g" / "notes.txt").write_text("stray")
    assert main(["conformance", "--golden", str(tmp_path / "g")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("odeattn conformance: ") for line in lines), lines
    assert any("$.format: '4' is not one of [2, 3, 4]" in line for line in lines), lines
    assert any("notes.txt: not listed in manifest.json" in line for line in lines)


def test_generate_into_an_unwritable_folder(capsys):
    assert main(["conformance", "generate", "--golden", "/proc/odeattn-golden"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("odeattn conformance generate: golden directory '/proc/odeattn-golden': not writable")


def test_a_team_set_prints_and_pins_its_digest(tmp_path, capsys):
    shutil.copytree(golden.GOLDEN_DIR, tmp_path / "g")
    set_digest = golden.digest(tmp_path / "g")
    argv = ["conformance", "--golden", str(tmp_path / "g"), "--backend", "spec", "-k", "derf_euler_encoder_float_nopad_s1_b2t5h2d8$"]
    assert main([*argv, "--expect-digest", set_digest]) == 0
    assert f"golden set: {tmp_path / 'g'}, 1 cases, digest {set_digest}" in capsys.readouterr().out


def test_mutants_refuses_what_it_does_not_take_and_bad_sets(tmp_path, capsys):
    assert main(["conformance", "mutants", "-k", "derf"]) == 2
    assert capsys.readouterr().err.strip() == "odeattn conformance mutants: -k: not taken here (only --golden and -j)"
    assert main(["conformance", "mutants", "--golden", str(tmp_path)]) == 2
    assert "manifest.json: no such file" in capsys.readouterr().err
