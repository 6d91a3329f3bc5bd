"""A fuzz finding shrunk to its essence (fuzzing/essence.py): each config field and input choice
reset to its simplest while the example still diverges, the bug's trigger kept; a decode finding
named at its token and cache slot, a grad finding at its gradient (cases/localise.first_at)."""

import dataclasses
import json

import numpy as np
import pytest

import ode_ref as R
from ode_ref.positions import alibi_bias
from odeattn.conformance.adapters import SpecAdapter
from odeattn.conformance.fuzzing.draw import Draw
from odeattn.conformance.fuzzing.essence import Essence, essential, simplest_config
from odeattn.conformance.fuzzing.fuzz import Diverged, FuzzRun, Probe, explain, fuzz, reduce_to_essence
from odeattn.conformance.fuzzing.fuzz_report import format_finding, write_json
from odeattn.conformance.mutation import planted


class _IgnoresAlibiScale(R.SelfAttention):
    """ALiBi's slopes without the config's alibi_scale: the port of the issue's motivation, which
    the golden set passed (its ALiBi cases all use 1)."""

    def alibi_bias(self, positions_q, positions_k, like):
        return alibi_bias(positions_q, positions_k, dataclasses.replace(self.config, alibi_scale=1.0), like.dtype)


class IgnoresAlibiScale(SpecAdapter):
    name, dtypes, variant = "ignores-alibi-scale", ("float32", "float64"), _IgnoresAlibiScale
    run_vjp = None  # the backward pass is the spec's own (as planted.py's ports): nothing planted there


CHUNK = 4


class ChunkedWeightGradient(SpecAdapter):
    """A backward pass whose output projection's weight gradient sums the batch rows of the first
    chunk of 4 only (its reduction over rows not looped): x_bar and the other gradients exact."""

    name, dtypes = "chunked-weight-gradient", ("float32", "float64")

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        x_bar, grads = super().run_vjp(config, params, x, padding_mask, z1_bar, dtype)
        first = np.array(z1_bar, copy=True)
        first[CHUNK:] = 0  # rows are independent: the first chunk's share of every gradient
        grads = dict(grads)
        grads["ode_func.out_proj.weight"] = super().run_vjp(config, params, x, padding_mask, first, dtype)[1][
            "ode_func.out_proj.weight"]
        return x_bar, grads


def _essence(port, d, dtype="float32"):
    """The finding of draw d judged through the fuzzer's own path (its Probe), reduced to its
    essence and explained, as fuzz() does once hypothesis has shrunk it."""
    run = FuzzRun(port.name, dtype)
    probe = Probe(run, port, params=None, time_budget=None, shrink_seconds=60.0, database=None)
    with pytest.raises(Diverged):
        probe(d)
    reduce_to_essence(run, probe, 60.0)
    return explain(run.finding, port, dtype)


NOISE = dict(norm_type="rms_norm", ode_solver="rk38", ode_steps=3)  # fields no planted bug here needs
NOISY_INPUT = dict(rows=(("holes", 1), ("right", 2)), scale=1e2, offset=-30.0, param_seed=7, input_seed=11)


def test_the_essence_keeps_the_trigger_and_resets_what_does_not_matter():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, positional_encoding="alibi",
                      alibi_scale=3.0, **NOISE)
    f = _essence(IgnoresAlibiScale(), Draw("block", cfg, 2, 9, **NOISY_INPUT))
    assert f.draw.fields() == {"hidden_size": 8, "num_heads": 2, "ode_solver": "euler", "ode_steps": 1,
                               "positional_encoding": "alibi", "ode_use_pe": True, "alibi_scale": 3.0}, f.draw.fields()
    assert (f.draw.rows, f.draw.scale, f.draw.offset, f.draw.param_seed, f.draw.input_seed) == (None, 1.0, 0.0, 0, 0)
    assert {"positional encoding", "positional_encoding", "alibi_scale"} <= set(f.essence.needed), f.essence
    assert {"norm_type", "ode_solver", "ode_steps", "mode", "padding", "offset", "scale"} <= set(f.essence.reset)
    assert f.result.failed and f.case.config == f.draw.config  # the finding is the reduced draw's own run
    text = format_finding(f)
    assert ("    essence:  needed (with each reset to its simplest the example passes): positional encoding, "
            "positional_encoding, alibi_scale; reset to the simplest, still diverging: norm_type, ") in text
    assert "rms_norm" not in text and "rk38" not in text and "holes" not in text


def test_the_essence_of_a_decode_finding_drops_the_fields_of_the_issue_s_example():
    """An irrelevant norm, rk38, rope_base 500 and an offset input (as issue 61's example kept) around a
    position-table bug: each reset, the encoding kept."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True, rope_base=500.0, norm_type="rms_norm",
                      ode_solver="rk38", ode_steps=2)
    f = _essence(planted.PositionTable(), Draw("decode", cfg, 1, 35, None, 1.0, -30.0, 3, 4, decoded=3))
    fields = f.draw.fields()
    assert fields["ode_use_pe"] and "rope_base" not in fields and "norm_type" not in fields, fields
    assert fields["ode_solver"] == "euler" and fields["ode_steps"] == 1 and f.draw.offset == 0.0
    assert f.quantity.startswith("decode_") and f.draw.kind.name == "decode" and fields["mode"] == "decoder"  # the kind's fixed field


def test_a_decode_finding_names_its_token_and_cache_slot(tmp_path):
    """Positions past the table of 32 diverge: the prompt (0..30) and token 1 (31) agree, token 2 (32) does not."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_use_pe=True)
    f = _essence(planted.PositionTable(), Draw("decode", cfg, 1, 34, None, 1.0, 0.0, 0, 0, decoded=3))
    assert f.draw.decoded == 3  # kept: decoding fewer would move the bug into the prompt
    assert f.quantity == "decode_2"
    at = f.first_at
    assert (at["token"], at["tokens"], at["position"], at["slot"], at["agree"]) == (2, 3, 32, 32, ["prefill", "decode_1"])
    # rk4, the default, is kept (euler would add a stored field); its one step of 4 stages each cached
    assert at["evaluations"] == 4 and "cache slot 32 of each of 4 cached evaluations (1 step x 4 stages of rk4)" in at["summary"]
    assert "    token:    decoded token 2 of 3, at position 32: cache slot 32" in format_finding(f)
    write_json([FuzzRun("p", "float32", finding=f)], tmp_path / "r.json", {})
    assert json.loads((tmp_path / "r.json").read_text())["runs"][0]["finding"]["first_at"]["slot"] == 32


def test_a_grad_finding_names_its_parameter_and_the_forward_stages_that_agree(tmp_path):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", **NOISE)
    f = _essence(ChunkedWeightGradient(), Draw("grad", cfg, 5, 3, None, 1.0, 100.0, 1, 2))
    assert f.draw.batch == 5 and f.draw.offset == 0.0 and set(f.draw.fields()) <= {"hidden_size", "num_heads", "ode_solver",
                                                                                   "ode_steps"}, f.draw
    assert f.quantity == "grad.ode_func.out_proj.weight"
    assert f.first_at["gradient"] == f.quantity and f.first_at["of"] == "the parameter ode_func.out_proj.weight"
    assert f.first_at["agree"] == ["x_bar", "grad.ode_func.qkv.weight"]
    assert f.stage is not None and f.stage["stage"] is None  # the forward pass it differentiates agrees
    text = format_finding(f)
    assert ("    gradient: grad.ode_func.out_proj.weight, the gradient of the parameter ode_func.out_proj.weight; "
            "x_bar and grad.ode_func.qkv.weight agree") in text
    assert "every stage of f(0, x) returned agrees" in text


def test_a_reset_that_cannot_be_judged_is_neither_kept_nor_needed_and_the_time_is_bounded():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_use_pe=True, positional_encoding="pape_ri", pape_num_positions=2,
                      norm_type="rms_norm")
    d = Draw("block", cfg, 1, 5, None, 1e2, 0.0, 1, 2)

    def judge(candidate):  # the norm's reset refused (None); the bug needs pape_ri, at any pape_num_positions
        return None if candidate.config.norm_type != cfg.norm_type else candidate.config.positional_encoding == "pape_ri"

    essence = Essence()
    out = essential(d, judge, essence=essence)
    assert (out.config.positional_encoding, out.config.pape_num_positions, out.config.norm_type, out.scale) == (
        "pape_ri", 1, "rms_norm", 1.0)
    assert essence.needed == ["positional encoding", "positional_encoding"] and "norm_type" not in essence.reset
    assert essence.reset == ["ode_steps", "pape_num_positions", "scale", "param_seed", "input_seed"], essence
    late = Essence()
    assert essential(d, judge, seconds=-1.0, essence=late) == d and late.stopped == "time" and not late.tries
    assert simplest_config(cfg)["ode_solver"] == R.SOLVERS[0] and simplest_config(cfg)["ode_steps"] == 1


def test_a_fuzz_run_s_finding_is_its_essence():
    """At the default budget, the alibi_scale bug's finding keeps ALiBi at a scale other than 1."""
    run = fuzz(IgnoresAlibiScale(), "float32", seed=2)  # seeds 2-5 find it at the default budget (0 and 1 do not)
    f = run.finding
    assert f is not None and f.draw.config.positional_encoding == "alibi" and f.draw.config.alibi_scale != 1.0
    assert f.essence is not None
    # each choice left away from its simplest is one the essence found needed (a reset passed)
    assert f.draw.config.norm_type == "layer_norm" or "norm_type" in f.essence.needed, (f.draw, f.essence)
    assert f.draw.offset == 0.0 or "offset" in f.essence.needed, (f.draw, f.essence)
    assert f.draw.rows is None or "padding" in f.essence.needed, (f.draw, f.essence)


def test_a_covering_array_cell_s_finding_has_its_sizes_shrunk_too():
    """A cell pins its sizes (hypothesis shrinks within them), so the essence shrinks each to its
    smallest that still fails: TileBoundary's decode finding at seq 127, d_model 24 becomes a block
    forward at seq 17 (one query past the tile), d_model 4; DecodePage's stays a decode finding,
    its ninth token kept at the draw space's shortest sequence past it, 15 (a block forward passes)."""
    cfg = R.ODEConfig(hidden_size=24, num_heads=1, mode="decoder", ode_steps=1, ode_solver="euler")
    for port, kind, seq in ((planted.TileBoundary(), "block", 17), (planted.DecodePage(), "decode", 15)):
        run = FuzzRun(port.name, "float32")
        probe = Probe(run, port, params=None, time_budget=None, shrink_seconds=60.0, database=None)
        with pytest.raises(Diverged):
            probe(Draw("decode", cfg, 2, 127, None, 1.0, 0.0, 0, 0, decoded=9))
        reduce_to_essence(run, probe, 60.0, sizes=True)
        d = run.finding.draw
        assert (d.kind.name, d.batch, d.seq, d.config.hidden_size) == (kind, 1, seq, 4), d
