"""What the export tests share: a folder holding configs and weights, the `odeattn export` call on
them, and the check of a refusal on the command line."""

import json

import pytest

import ode_ref as R
from odeattn.cli import main


@pytest.fixture
def files(tmp_path):
    """tmp_path with c.json / c.safetensors (a float block) and b.json / b.safetensors (BitLinear),
    D 16, 2 heads, 2 steps."""
    for name, c in (("c", R.ODEConfig(hidden_size=16, num_heads=2, ode_steps=2)),
                    ("b", R.ODEConfig(hidden_size=16, num_heads=2, use_bitnet=True, ode_steps=2))):
        (tmp_path / f"{name}.json").write_text(json.dumps(c.to_dict()))
        R.save_params(R.init_params(c), tmp_path / f"{name}.safetensors")
    return tmp_path


def _export_cli(d, *extra, name="c"):
    """`odeattn export` on d's config and weights `name`; its exit code."""
    return main(["export", "--config", str(d / f"{name}.json"), "--weights", str(d / f"{name}.safetensors"), *extra])


def _assert_refused(files, capsys, extra, name, message):
    """`odeattn export ... extra` exits 2 with one line holding message, and writes nothing."""
    before = sorted(p.name for p in files.iterdir())
    assert _export_cli(files, "-o", str(files / "m.onnx"), *extra, name=name) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in files.iterdir()) == before


@pytest.fixture
def export_cli():
    return _export_cli


@pytest.fixture
def assert_refused():
    return _assert_refused
