"""Property-based: on generated configs, shapes, masks and inputs, every installed backend agrees
with ode_ref (conformance.running.compare.run_case). Derandomized (the `ci` hypothesis profile): the same
examples on every run."""

import importlib.util

import pytest
from hypothesis import given
from hypothesis import strategies as st

import ode_ref as R
from ode_ref.precision import HALF_DTYPES
from odeattn.conformance.adapters import missing_requirements
from odeattn.conformance.cases import CaseSpec, build_case
from odeattn.conformance.running.compare import run_case


# spec, torch, jax, onnxruntime, onnxruntime-integer: each whose packages are installed, in float32
# and float64 (their half rows run on the golden set in the main job, and on 16 configs in
# tests/backends/test_precision.py: a JAX half row compiles per config, 5 times this test's time). A
# port that is installed but fails to import fails here (make_adapter raises), it is not skipped.
NAMES = [n for n in ("spec", "torch", "jax", "onnxruntime", "onnxruntime-integer") if not missing_requirements(n)]


@st.composite
def case_specs(draw):
    heads = draw(st.integers(1, 3))
    head_dim = draw(st.integers(1, 5))
    norm = draw(st.sampled_from(R.NORM_TYPES))
    if norm == "dynamic_tanh" and heads * head_dim < 2:
        head_dim = 2
    config = R.ODEConfig(
        hidden_size=heads * head_dim, num_heads=heads, norm_type=norm,
        ode_solver=draw(st.sampled_from(R.SOLVERS)), ode_steps=draw(st.integers(1, 4)),
        mode=draw(st.sampled_from(R.MODES)), use_bitnet=draw(st.booleans()),
    )
    return CaseSpec(
        name="block_property", config=config, batch=draw(st.integers(1, 3)), seq=draw(st.integers(1, 6)),
        padding=draw(st.booleans()), param_seed=draw(st.integers(0, 2**16)), input_seed=draw(st.integers(0, 2**16)),
        scale=draw(st.sampled_from([1e-2, 1.0, 10.0, 1e3])),
    )


# The examples' count and seed: the hypothesis profile (tests/conftest.py; `ci` by default, derandomized)
@given(spec=case_specs())
def test_every_backend_agrees_with_the_spec(builtin_adapter, spec):
    case = build_case(spec)  # redraws the input until it is a fair test (conformance.cases.matrix)
    for backend in map(builtin_adapter, NAMES):
        for dtype in (d for d in backend.dtypes if d not in HALF_DTYPES):
            result = run_case(backend, case, dtype)
            # the integer BitLinear export runs use_bitnet blocks only, and says so for the others
            want = "skipped" if backend.name == "onnxruntime-integer" and not spec.config.use_bitnet else "passed"
            assert result.status == want, f"{backend.name}/{dtype} on {spec}: {result.status} {result.message}"


def test_every_installed_port_takes_part():
    expected = {"spec"} | {n for n, mod in (("torch", "torch"), ("jax", "jax"), ("onnxruntime", "onnxruntime"),
                                            ("onnxruntime-integer", "onnxruntime"))
                           if importlib.util.find_spec(mod) is not None}
    if expected == {"spec"}:
        pytest.skip("no port is installed")
    assert set(NAMES) == expected
