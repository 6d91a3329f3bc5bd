"""Every command that writes, run into a folder holding a user's files: each file stays as it was,
byte for byte, unless it was named as the output with --force, and nothing else is left behind
(ode_ref.files.replacing: a file is written whole or not at all)."""

import numpy as np
import pytest

from odeattn.cli import main

pytest.importorskip("onnxruntime")
pytest.importorskip("safetensors")

# a user's files at each name a command could write (its default, or what a user might name)
OTHERS = {"z.npy": b"my z", "diagnose.png": b"my plot", "demo_train.png": b"my curves", "r.json": b"{}",
          "r.xml": b"<mine/>", "bench.png": b"my bench", "block.optimized.onnx": b"my optimised model",
          "notes.txt": b"mine", "weights.npz": b"my npz", "new.optimized.onnx": b"my other optimised model"}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """tmp_path holding what `odeattn init` and `odeattn export` write (config.json,
    weights.safetensors, x.npy, block.onnx) and OTHERS, the working folder of the test."""
    assert main(["init", str(tmp_path), "--hidden-size", "8", "--num-heads", "2", "--steps", "2"]) == 0
    assert main(["export", "--config", str(tmp_path / "config.json"), "--weights", str(tmp_path / "weights.safetensors"),
                 "-o", str(tmp_path / "block.onnx")]) == 0
    (tmp_path / "c.onnx").write_text((tmp_path / "config.json").read_text())  # a config under a model's name
    for name, data in OTHERS.items():
        (tmp_path / name).write_bytes(data)
    assert main(["init", str(tmp_path / "lm"), "--lm", "--hidden-size", "8", "--num-heads", "2", "--vocab-size", "16",
                 "--num-layers", "1", "--steps", "1"]) == 0
    (tmp_path / "lm" / "model.onnx").write_bytes(b"my model")
    (tmp_path / "fuzz-repro" / "spec-float64").mkdir(parents=True)
    (tmp_path / "fuzz-repro" / "spec-float64" / "case.json").write_text("{}")  # an earlier run's repro
    (tmp_path / "x-link.npy").symlink_to("x.npy")
    (tmp_path / "x-hard-link.npy").hardlink_to(tmp_path / "x.npy")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def snapshot(folder) -> dict:
    """path in folder -> bytes (a symbolic link: where it points), every file below it."""
    return {p.relative_to(folder).as_posix(): str(p.readlink()).encode() if p.is_symlink() else p.read_bytes()
            for p in folder.rglob("*") if p.is_symlink() or p.is_file()}


EXPORT = ["export", "--config", "config.json", "--weights", "weights.safetensors"]
RUN = ["run", "block.onnx", "--x", "x.npy"]
FUZZ = ["conformance", "fuzz", "--backend", "spec", "--dtype", "float64", "--examples", "2"]
GENAI = ["export", "--config", "lm/config.json", "--weights", "lm/weights.safetensors", "--genai", "lm"]
DIAGNOSE = ["diagnose", "--config", "config.json", "--weights", "weights.safetensors", "--x", "x.npy", "--max-steps", "2",
            "--ref-steps", "4"]

REFUSED = [  # (argv, what the one line holds): exit 2, nothing changed
    (["init", "."], "config.json, weights.safetensors, x.npy: exist already; pass --force to overwrite"),
    (["init", "lm", "--lm"], "lm/config.json, lm/weights.safetensors: exist already; pass --force to overwrite"),
    (GENAI, "--genai: 'lm/model.onnx' exists already; pass --force to overwrite it"),
    ([*EXPORT, "-o", "block.onnx"], "-o: 'block.onnx' exists already; pass --force to overwrite it"),
    (["export", "--config", "c.onnx", "--weights", "weights.safetensors", "-o", "c.onnx", "--force"],
     "-o: 'c.onnx' is the file given to --config; expected a different file"),
    ([*RUN, "-o", "z.npy"], "-o: 'z.npy' exists already; pass --force to overwrite it"),
    ([*RUN, "-o", "x.npy", "--force"], "-o: 'x.npy' is the file given to --x; expected a different file"),
    (["run", "block.onnx", "--x", "x-link.npy", "-o", "x.npy", "--force"],
     "-o: 'x.npy' is the file given to --x; expected a different file"),
    (["run", "block.onnx", "--x", "x-hard-link.npy", "-o", "x.npy", "--force"],
     "-o: 'x.npy' is the file given to --x; expected a different file"),
    ([*EXPORT, "-o", "new.onnx", "--optimize"], "--optimize: 'new.optimized.onnx' exists already; pass --force to overwrite it"),
    (DIAGNOSE, "--plot: 'diagnose.png' exists already; pass --force to overwrite it"),
    ([*DIAGNOSE, "--plot", "x.npy"], "--plot: expected a file ending in .png"),
    (["demo", "train", "--json", "r.json", "--no-plot"], "--json: 'r.json' exists already; pass --force to overwrite it"),
    (["demo", "train"], "--plot: 'demo_train.png' exists already; pass --force to overwrite it"),
    (["bench", "--json", "r.json"], "--json: 'r.json' exists already; pass --force to overwrite it"),
    (["bench", "--plot", "bench.png"], "--plot: 'bench.png' exists already; pass --force to overwrite it"),
    (["conformance", "--backend", "spec", "-k", "derf", "--json", "r.json"],
     "--json: 'r.json' exists already; pass --force to overwrite it"),
    (["conformance", "--backend", "spec", "-k", "derf", "--junit", "r.xml"],
     "--junit: 'r.xml' exists already; pass --force to overwrite it"),
    (["conformance", "--backend", "spec", "-k", "derf", "--json", "new.json", "--junit", "new.json", "--force"],
     "--junit: 'new.json' is the file given to --json; expected a different file"),
    ([*FUZZ, "--json", "r.json"], "--json: 'r.json' exists already; pass --force to overwrite it"),
    ([*FUZZ, "--json", "new.json", "--junit", "new.json", "--force"], "--junit: 'new.json' is the file given to --json"),
    ([*FUZZ, "--repro", "notes.txt"], "--repro: expected a folder; got the file 'notes.txt'"),
    (FUZZ, "--repro: 'fuzz-repro/spec-float64' holds files already; pass --force to replace them"),
    (["conformance", "generate", "--golden", "."], "golden directory '.': expected an empty folder or one holding a golden set"),
]


@pytest.mark.parametrize("argv, message", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_command_refuses_to_replace_a_user_s_file_in_one_line(folder, argv, message, capsys):
    before = snapshot(folder)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert snapshot(folder) == before


@pytest.mark.parametrize("argv, written", [
    (["init", ".", "--hidden-size", "8", "--num-heads", "2", "--seed", "3", "--force"], {"config.json", "weights.safetensors", "x.npy"}),
    ([*EXPORT, "-o", "block.onnx", "--steps-input", "--force"], {"block.onnx"}),
    ([*RUN, "-o", "z.npy", "--force"], {"z.npy"}),
    ([*RUN, "-o", "Z2.NPY"], {"Z2.NPY"}),
    ([*DIAGNOSE, "--force"], {"diagnose.png"}),
    ([*GENAI, "--force"], {"lm/model.onnx", "lm/genai_config.json"}),
    ([*FUZZ, "--json", "r.json", "--junit", "new.xml", "--force"], {"r.json", "new.xml"}),
], ids=["init", "export", "run", "run-new-file", "diagnose", "export-genai", "fuzz"])
def test_with_force_only_the_named_output_changes(folder, argv, written):
    before = snapshot(folder)
    assert main(argv) == 0
    after = snapshot(folder)
    assert set(after) == set(before) | written  # no temporary file left
    assert {name for name in after if after[name] != before.get(name)} == written
    if "Z2.NPY" in written:
        assert np.load(folder / "Z2.NPY").shape == (2, 8, 8)  # under the name given, not Z2.NPY.npy


def test_a_failed_write_leaves_the_output_as_it_was(folder, monkeypatch, capsys):
    """The write fails at its last step, the rename onto the output (an OSError, as a full disk
    gives): the file named with --force keeps its bytes and no temporary file is left."""
    import ode_ref.files

    real = ode_ref.files.os.replace

    def full_disk(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ode_ref.files.os, "replace", full_disk)
    before = snapshot(folder)
    with pytest.raises(OSError):
        main([*RUN, "-o", "z.npy", "--force"])
    monkeypatch.setattr(ode_ref.files.os, "replace", real)
    assert snapshot(folder) == before


@pytest.mark.parametrize("argv, files", [
    (["init", "new", "--hidden-size", "8", "--num-heads", "2"], 3),
    (["init", "new", "--lm", "--hidden-size", "8", "--num-heads", "2", "--vocab-size", "16"], 2),
    (["export", "--config", "lm/config.json", "--weights", "lm/weights.safetensors", "--genai", "new"], 2),
], ids=["init", "init-lm", "export-genai"])
def test_a_new_set_of_files_appears_whole_or_not_at_all(folder, monkeypatch, argv, files):
    """A new folder's set (init's files, a GenAI folder) is written into a hidden sibling folder,
    renamed onto the folder at the end: a write failing at the set's last file leaves none of the
    set and nothing hidden behind; the same command then leaves the whole set and nothing else."""
    import os

    import ode_ref.files

    real, calls = ode_ref.files.os.replace, []

    def fails_last(src, dst):
        calls.append(dst)
        if len(calls) == files:
            raise OSError(28, "No space left on device")
        real(src, dst)

    monkeypatch.setattr(ode_ref.files.os, "replace", fails_last)
    before, names = snapshot(folder), sorted(os.listdir(folder))
    with pytest.raises(OSError):
        main(argv)
    assert snapshot(folder) == before and sorted(n for n in os.listdir(folder) if n != "new") == names
    assert not (folder / "new").exists() or not any((folder / "new").iterdir())  # the set's folder: empty, if made
    monkeypatch.setattr(ode_ref.files.os, "replace", real)
    assert main(argv) == 0
    assert sorted(os.listdir(folder)) == sorted({*names, "new"}) and len(os.listdir(folder / "new")) == files
