"""The runner catches deliberately broken backends and says where they diverge first."""

import dataclasses
import json
import sys
import types
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import ode_ref as R
from conformance import backends as B
from conformance.golden import load_cases
from conformance.runner import format_report, run_case, run_suite, select, write_json, write_junit
from odeattn.cli import main

CASES = load_cases()


class Rk38ForRk4(B.SpecBackend):
    """The classic confusion: torchdiffeq's 'rk4' is the 3/8 rule."""

    name = "rk38-for-rk4"

    def _swap(self, config):
        return dataclasses.replace(config, ode_solver="rk38") if config.ode_solver == "rk4" else config

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return super().run_func(self._swap(config), params, t, x, padding_mask, dtype)

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        return super().run_trajectory(self._swap(config), params, x, padding_mask, dtype)


class StrictCausal(R.SelfAttention):
    def build_mask(self, seq_len, padding_mask=None):
        mask = super().build_mask(seq_len, padding_mask)
        if self.config.mode == "decoder":
            mask = mask & np.tri(seq_len, k=-1, dtype=bool)  # j < i: the diagonal dropped, off by one
        return mask


class CausalOffByOne(B.SpecBackend):
    name = "causal-off-by-one"

    def run_func(self, config, params, t, x, padding_mask, dtype):
        return R.ode_func(params, t, x, config, padding_mask, attention=StrictCausal(config))

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        return R.ode_block(params, x, config, padding_mask, attention=StrictCausal(config), return_trajectory=True)[1]


class BlockOnly:
    """The minimal protocol: no trajectory, no f."""

    name, dtypes = "block-only", ("float32",)

    def supports(self, config, dtype):
        return "no BitLinear here" if config.use_bitnet else None

    def run_block(self, config, params, x, padding_mask, dtype):
        return R.ode_block(params, x, config, padding_mask)


def test_rk38_in_place_of_rk4_is_caught_at_the_first_step():
    # Not the large-magnitude cases: with |x| ~ 1e4 the normalised f hardly changes along the
    # path, so every fourth-order rule integrates it exactly to within the state's own rounding.
    rk4 = [c for c in CASES if c.config.ode_solver == "rk4" and "large_magnitude" not in c.name]
    assert len(rk4) >= 8
    for case in rk4:
        r = run_case(Rk38ForRk4(), case, "float64")
        assert r.status == "failed"
        assert r.message.startswith(f"diverges first at step_1 (t = 1/{case.config.ode_steps})"), r.message
        assert r.quantities[0].quantity == "f0" and r.quantities[0].error == 0.0  # f itself is right
    others = [c for c in CASES if c.config.ode_solver != "rk4"][:5]
    assert all(run_case(Rk38ForRk4(), c, "float64").status == "passed" for c in others)


def test_causal_off_by_one_is_caught_in_f():
    # seq > 1: with one token the only key is masked, and a fully masked row is uniform by the spec's
    # rule, which over one key is the unmasked answer; the bug cannot show there.
    decoder = [c for c in CASES if c.config.mode == "decoder" and c.x.shape[1] > 1]
    assert len(decoder) >= 8
    for case in decoder:
        r = run_case(CausalOffByOne(), case, "float64")
        assert r.status == "failed" and r.message.startswith("diverges first at f0 = f(0, x)"), (case.name, r.message)
    encoder = next(c for c in CASES if c.config.mode == "encoder")
    assert run_case(CausalOffByOne(), encoder, "float64").status == "passed"


def test_wrong_dtype_shape_nan_and_crash_are_reported():
    case = CASES[0]

    class Wrong(BlockOnly):
        def __init__(self, fn):
            self.fn = fn

        def run_block(self, config, params, x, padding_mask, dtype):
            return self.fn(x)

    assert run_case(Wrong(lambda x: x.astype(np.float64)), case, "float32").message == "z1: expected dtype float32; got float64"
    assert "z1: expected shape" in run_case(Wrong(lambda x: x[:, :1]), case, "float32").message
    assert "non-finite" in run_case(Wrong(lambda x: x * np.float32("nan")), case, "float32").message
    r = run_case(Wrong(lambda x: 1 / 0), case, "float32")
    assert r.status == "error" and r.message == "ZeroDivisionError: division by zero"


def test_minimal_backend_skips_and_passes():
    results = run_suite([BlockOnly()], CASES)
    assert {r.status for r in results} == {"passed", "skipped"}
    assert all(r.quantities[0].quantity == "z1" for r in results if r.status == "passed")


def test_select_xfail_and_reports(tmp_path):
    chosen = select(CASES, include=["rk4"], exclude=["bitnet", "large_magnitude"])
    assert chosen and all("rk4" in c.name and "bitnet" not in c.name and "large" not in c.name for c in chosen)
    results = run_suite([Rk38ForRk4()], chosen, xfail=["rk38-for-rk4/float64/.*rk4"])
    assert {r.status for r in results} == {"xfailed"}
    report = format_report(results)
    assert "rk38-for-rk4" in report and "failures:" not in report
    results = run_suite([Rk38ForRk4()], chosen, fail_fast=True)
    assert len(results) == 1 and results[0].failed
    write_json(results, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["summary"][0]["failed"] == 1
    write_junit(results, tmp_path / "r.xml")
    assert ET.parse(tmp_path / "r.xml").getroot().find(".//failure") is not None


@pytest.fixture
def plugin_module(monkeypatch):
    module = types.ModuleType("my_odeattn_plugin")
    module.broken = CausalOffByOne()
    module.Good = BlockOnly
    monkeypatch.setitem(sys.modules, "my_odeattn_plugin", module)
    return module


def test_cli_backend_reference_and_exit_codes(plugin_module, tmp_path, capsys):
    code = main(["conformance", "--backend", "my_odeattn_plugin:Good", "-k", "layer_norm", "--junit", str(tmp_path / "j.xml")])
    out = capsys.readouterr().out
    assert code == 0 and "block-only" in out and (tmp_path / "j.xml").exists()
    code = main(["conformance", "--backend", "my_odeattn_plugin:broken", "-k", "decoder", "--json", str(tmp_path / "r.json")])
    out = capsys.readouterr().out
    assert code == 1 and "diverges first at f0" in out
    assert main(["conformance", "-k", "no-such-case"]) == 2


def test_cli_refuses_bad_backend_references(plugin_module, capsys):
    assert main(["conformance", "--backend", "no_colon"]) == 2
    assert "expected 'package.module:object'" in capsys.readouterr().err
    plugin_module.not_a_backend = object()
    assert main(["conformance", "--backend", "my_odeattn_plugin:not_a_backend"]) == 2
    assert "missing ['name', 'dtypes', 'supports', 'run_block']" in capsys.readouterr().err


def test_entry_point_backends_are_discovered(monkeypatch, plugin_module):
    import importlib.metadata as md

    ep = md.EntryPoint(name="mine", value="my_odeattn_plugin:Good", group=B.ENTRY_POINT_GROUP)
    monkeypatch.setattr(md, "entry_points", lambda group: [ep] if group == B.ENTRY_POINT_GROUP else [])
    found = B.discover()
    assert "mine" in found and B.make_backend(found["mine"]).name == "block-only"
