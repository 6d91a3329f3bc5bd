import json
import shutil

import numpy as np
import pytest

from conformance import golden
from conformance.cases import build_all, case_specs


def test_regeneration_is_byte_for_byte(tmp_path):
    golden.write_golden(tmp_path)
    stored = sorted(p.name for p in golden.GOLDEN_DIR.iterdir() if p.is_file())
    fresh = sorted(p.name for p in tmp_path.iterdir())
    assert fresh == stored
    for name in stored:
        assert (tmp_path / name).read_bytes() == (golden.GOLDEN_DIR / name).read_bytes(), name


def test_manifest_describes_every_case():
    manifest = golden.read_manifest()
    assert [e["name"] for e in manifest["cases"]] == [s.name for s in case_specs()]
    size = sum(p.stat().st_size for p in golden.GOLDEN_DIR.iterdir())
    assert size < 4e6  # small enough for CI and a repository
    for e in manifest["cases"]:
        steps = e["config"]["ode_steps"]
        assert list(e["quantities"]) == ["f0"] + [f"step_{k}" for k in range(1, steps + 1)] + ["z1"]


def test_loaded_cases_equal_the_built_ones():
    for built, loaded in zip(build_all(), golden.load_cases()):
        assert built.name == loaded.name and built.config == loaded.config
        for q, arr in built.quantities().items():
            np.testing.assert_array_equal(loaded.quantities()[q], arr)
        assert loaded.params.keys() == built.params.keys()
        assert (loaded.padding_mask is None) == (built.padding_mask is None)


def test_coverage_of_the_issue_matrix():
    specs = case_specs()
    cfgs = [s.config for s in specs]
    assert {c.norm_type for c in cfgs} == {"layer_norm", "rms_norm", "prms_norm", "flash_norm", "dynamic_tanh", "derf"}
    assert {c.ode_solver for c in cfgs} == {"euler", "midpoint", "heun", "ralston", "rk4", "rk38"}
    assert {c.ode_steps for c in cfgs} >= set(range(1, 9))
    assert {c.mode for c in cfgs} == {"encoder", "decoder"} and {c.use_bitnet for c in cfgs} == {False, True}
    assert any(s.seq == 1 for s in specs) and any(c.num_heads == 1 for c in cfgs) and any(s.batch == 3 for s in specs)
    assert any(c.hidden_size & (c.hidden_size - 1) for c in cfgs)  # a width not a power of two
    assert any(s.scale >= 1e3 for s in specs) and {s.padding for s in specs} == {False, True}


@pytest.fixture
def copy(tmp_path):
    shutil.copytree(golden.GOLDEN_DIR, tmp_path / "g")
    return tmp_path / "g"


def test_tampered_case_is_refused(copy):
    entry = golden.read_manifest(copy)["cases"][0]
    data = bytearray((copy / entry["file"]).read_bytes())
    data[-3] ^= 0x01  # one bit of one float
    (copy / entry["file"]).write_bytes(bytes(data))
    with pytest.raises(golden.GoldenError, match=f"golden case '{entry['name']}': .* the file was modified or truncated"):
        golden.load_cases(copy)


def test_truncated_and_missing_files_are_refused(copy):
    entries = golden.read_manifest(copy)["cases"]
    path = copy / entries[1]["file"]
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(golden.GoldenError, match="modified or truncated"):
        golden.load_case(entries[1], copy)
    (copy / entries[2]["file"]).unlink()
    with pytest.raises(golden.GoldenError, match=f"file '{entries[2]['file']}' is missing"):
        golden.load_case(entries[2], copy)


def test_bad_manifest_is_refused(copy):
    (copy / "manifest.json").write_text("{not json")
    with pytest.raises(golden.GoldenError, match="not valid JSON"):
        golden.load_cases(copy)
    (copy / "manifest.json").write_text(json.dumps({"format": 99, "cases": []}))
    with pytest.raises(golden.GoldenError, match="expected format 1; got 99"):
        golden.load_cases(copy)
    (copy / "manifest.json").unlink()
    with pytest.raises(golden.GoldenError, match="odeattn conformance generate"):
        golden.load_cases(copy)
