"""The compile floor (odeattn.bench.floor): each row compiles one program, of the port's f alone."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("jax")

from odeattn.bench.floor import FloorJax, floor_rows
from odeattn.conformance.wire import counters
from odeattn.conformance.golden import GOLDEN_DIR, load_case, read_manifest
from odeattn.conformance.adapters.protocol import NotSupported
from odeattn.conformance.cases.tolerance import relative_error

BLOCK = "block_derf_euler_encoder_float_nopad_s8_b2t5h2d8"  # 8 steps: the block's outputs are not f's


def _case(name_start: str):
    return load_case(next(e for e in read_manifest(GOLDEN_DIR)["cases"] if e["name"].startswith(name_start)), GOLDEN_DIR)


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("odeattn/bench/test_floor")


@pytest.fixture(scope="session")
def floor():
    adapter = FloorJax()
    counters.watch_jax()
    return adapter


def _programs(call):
    before = counters.snapshot()
    out = call()
    return out, counters.since(before)["programs"]


def test_a_block_row_is_one_program_of_f_the_specs_f(floor):
    case = _case(BLOCK)
    args = (case.config, case.params, 0.0, case.x, case.padding_mask, "float64")
    (f0, trajectory), programs = _programs(lambda: (floor.run_func(*args), floor.run_trajectory(*args[:2], *args[3:])))
    assert programs == 1
    assert relative_error(f0, case.f0) < 1e-12  # the JAX tests' float64 bound on the port against the spec
    assert trajectory.shape == (1, *case.x.shape) and np.array_equal(trajectory[0], f0)


def test_a_grad_row_is_one_program_the_vjp_of_f(floor):
    case = _case("grad_")
    x_bar, programs = _programs(lambda: floor.run_vjp(case.config, case.params, case.x, case.padding_mask, case.inputs["z1_bar"],
                                                      "float64")[0])
    assert programs == 1
    # <z1_bar, f(x + e v) - f(x - e v)> / 2e against <v, x_bar>: central differences in float64 at
    # e = 1e-6, measured 4e-11 relative here (e^2 truncation, 1e-16 / e rounding); the block's vjp
    # (z1 = x + f(x) for this euler x 1 case) gave 2.5e-2
    v, e = np.random.default_rng(0).standard_normal(case.x.shape), 1e-6
    f = [floor.run_func(case.config, case.params, 0.0, case.x + s * e * v, case.padding_mask, "float64") for s in (1, -1)]
    assert abs(np.sum(case.inputs["z1_bar"] * (f[0] - f[1])) / (2 * e) - np.sum(v * x_bar)) < 1e-6 * np.abs(v * x_bar).sum()


def test_a_decode_row_is_f_on_the_prompt_and_an_encoder_row_is_skipped(floor):
    case = _case("decode_")
    prompt = case.x.shape[1] - case.decoded
    out, programs = _programs(lambda: floor.run_decode(case.config, case.params, case.x, case.padding_mask, prompt,
                                                       "float64"))
    assert programs == 1 and out.shape == (case.x.shape[0], prompt, case.x.shape[2])
    with pytest.raises(NotSupported):
        floor.run_encoder(None, {}, case.x, None, "float64")


def test_rows_that_differ_in_solver_and_steps_share_fs_program(floor):
    case = _case(BLOCK)
    other = dataclasses.replace(case.config, ode_solver="rk4", ode_steps=3)
    params = {k: v.astype(np.float32) for k, v in case.params.items()}  # float32: a program no other test compiled
    args = (params, 0.0, case.x.astype(np.float32), case.padding_mask, "float32")
    (a, b), programs = _programs(lambda: (floor.run_func(case.config, *args), floor.run_func(other, *args)))
    assert programs == 1 and np.array_equal(a, b)


def test_floor_rows_reads_each_backends_profile_cold_then_warm():
    lines = []
    rows = floor_rows(("spec",), ("-k", BLOCK + "$"), log=lines.append)
    assert list(rows) == ["spec cold", "spec warm"] and len(lines) == 2
    assert all(r["programs"] == 0 and r["run_wall"] > 0 and r["wall"] > 0 for r in rows.values())
