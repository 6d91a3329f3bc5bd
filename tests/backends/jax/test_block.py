"""The JAX port against the spec where the conformance suite does not reach, and its transformations."""

import re

import numpy as np
import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

import ode_ref as R  # noqa: E402
from odeattn.backends import jax as J  # noqa: E402
from odeattn.conformance.cases.fair import make_inputs  # noqa: E402
from odeattn.conformance.golden import load_cases  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402

CASES = load_cases()
block_jit = J.ode_block_jit


def as32(params):
    return {k: v.astype(np.float32) for k, v in params.items()}


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


def test_importing_leaves_x64_alone():
    assert not jax.config.jax_enable_x64  # the test session never turned it on globally


def test_jit_equals_eager(x64):
    for case in CASES[:6]:
        eager = J.ode_block(case.params, case.x, case.config, case.padding_mask)
        jitted = block_jit(case.params, case.x, case.config, case.padding_mask)
        assert relative_error(np.asarray(jitted), np.asarray(eager)) <= tolerance(case.e32_of("z1"), "float64")


def test_ode_func_equals_spec(x64):
    case = CASES[3]
    got = J.ode_func(case.params, 0.25, case.x, case.config, case.padding_mask)
    assert relative_error(np.asarray(got), R.ode_func(case.params, 0.25, case.x, case.config, case.padding_mask)) <= 1e-13


@pytest.mark.parametrize("norm", ["layer_norm", "dynamic_tanh", "derf", "prms_norm"])
def test_grad_against_central_differences_of_the_spec(norm, x64):
    cfg = R.ODEConfig(hidden_size=4, num_heads=2, norm_type=norm, ode_solver="rk4", ode_steps=2, mode="decoder")
    params = R.init_params(cfg, 1, perturb_norms=True)
    x = np.random.default_rng(2).normal(size=(1, 3, 4))
    w = np.random.default_rng(3).normal(size=x.shape)  # loss = sum(w * z(1))

    g_x, g_p = jax.grad(lambda x, p: jnp.sum(w * J.ode_block(p, x, cfg)), argnums=(0, 1))(x, params)
    eps = 1e-6  # central differences: truncation ~eps^2 * f''' ~1e-12, rounding ~1e-16 / eps = 1e-10

    def fd(fun, a):
        out = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            d = np.zeros_like(a)
            d[i] = eps
            out[i] = (fun(a + d) - fun(a - d)) / (2 * eps)
        return out

    spec_loss = lambda x, p: float(np.sum(w * R.ode_block(p, x, cfg)))  # noqa: E731
    np.testing.assert_allclose(np.asarray(g_x), fd(lambda a: spec_loss(a, params), x), rtol=1e-6, atol=1e-8)
    for name in ("ode_func.out_proj.weight", "ode_func.norm." + next(iter(R.NORM_PARAMS[norm]))):
        want = fd(lambda a: spec_loss(x, {**params, name: a}), params[name])
        np.testing.assert_allclose(np.asarray(g_p[name]), want, rtol=1e-6, atol=1e-8)


def test_bitlinear_straight_through_gradient(x64):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, use_bitnet=True)
    params = R.init_params(cfg, 1)
    x = np.random.default_rng(0).normal(size=(1, 3, 8))
    g = jax.grad(lambda p: jnp.sum(J.ode_block(p, x, cfg) ** 2))(params)
    for v in g.values():
        assert np.isfinite(np.asarray(v)).all() and np.abs(np.asarray(v)).sum() > 0
    # the forward is the spec's quantiser exactly (custom_jvp, not x + stop_gradient(q - x))
    assert relative_error(np.asarray(J.ode_block(params, x, cfg)), R.ode_block(params, x, cfg)) <= 1e-13


def test_vmap_over_parameter_sets(x64):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, norm_type="rms_norm", ode_solver="heun", ode_steps=3)
    sets = [R.init_params(cfg, s, perturb_norms=True) for s in range(3)]
    stacked = {k: np.stack([p[k] for p in sets]) for k in sets[0]}
    x = np.random.default_rng(0).normal(size=(2, 5, 8))
    out = jax.vmap(lambda p: J.ode_block(p, x, cfg))(stacked)
    for i, p in enumerate(sets):
        assert relative_error(np.asarray(out[i]), R.ode_block(p, x, cfg)) <= 1e-13


def test_scan_keeps_the_traced_program_independent_of_steps():
    """Compile time tracks program size; with lax.scan it is the same at 1 and 64 steps."""
    sizes = []
    for steps in (1, 64):
        cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=steps, use_bitnet=True)
        params = as32(R.init_params(cfg))
        jaxpr = jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg))(params, np.zeros((1, 3, 8), np.float32))
        scan = next(e for e in jaxpr.eqns if e.primitive.name == "scan")
        sizes.append((len(jaxpr.eqns), len(scan.params["jaxpr"].eqns), scan.params["length"]))
    assert sizes[0][:2] == sizes[1][:2] and (sizes[0][2], sizes[1][2]) == (1, 64)


@pytest.mark.parametrize("solver", ["euler", "rk2_gated", "rk4", "rk38"])
def test_weight_quantisation_outside_the_loop_and_one_evaluation_per_program(count_primitive, solver):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=4, use_bitnet=True, ode_solver=solver)
    closed = jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg))(as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32))
    scan = next(e for e in closed.jaxpr.eqns if e.primitive.name == "scan")
    assert count_primitive(closed.jaxpr, "round", skip_scan=True) == 2  # the two weights, once
    # activations: 2 per evaluation of f, and the program holds one whatever the stages (a stage loop)
    assert count_primitive(scan.params["jaxpr"].jaxpr, "round") == 2


@pytest.mark.parametrize("solver, steps_written, written", [("momentum", 1, 1), ("ab2", 2, 1 * 2 + 1), ("ab3", 3, 2 * 3 + 1)])
def test_a_multistep_solver_writes_out_its_start_and_scans_one_evaluation(count_primitive, solver, steps_written, written):
    """Its start (the starter's stages and the first step that fills the past; momentum's first
    step) written out, the rest a scan holding one evaluation: BitLinear's activations rounded
    twice an evaluation, the weights once, outside."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=6, use_bitnet=True, ode_solver=solver)
    closed = jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg))(as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32))
    scan = next(e for e in closed.jaxpr.eqns if e.primitive.name == "scan")
    assert count_primitive(closed.jaxpr, "round", skip_scan=True) == 2 + 2 * written
    assert count_primitive(scan.params["jaxpr"].jaxpr, "round") == 2 and scan.params["length"] == 6 - steps_written
    # checkpoint=True: the scanned step under jax.checkpoint (its values jax.checkpoint's own; the RK
    # solvers' checkpoint test above measures the gradients' rounding)
    with_checkpoint = jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg, checkpoint=True))(as32(R.init_params(cfg)),
                                                                                         np.zeros((1, 3, 8), np.float32))
    scan = next(e for e in with_checkpoint.jaxpr.eqns if e.primitive.name == "scan")
    assert [e.primitive.name for e in scan.params["jaxpr"].jaxpr.eqns] == ["remat2"]


def test_padded_positions_unchanged_and_decoder_causal(x64):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", use_bitnet=True, norm_type="derf")
    params = R.init_params(cfg, 4, perturb_norms=True)
    x = np.random.default_rng(1).normal(size=(2, 6, 8))
    mask = np.array([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)
    z = np.asarray(block_jit(params, x, cfg, mask))
    np.testing.assert_array_equal(z[~mask], x[~mask])
    x2 = x.copy()
    x2[:, 3:] += 5.0
    np.testing.assert_array_equal(np.asarray(block_jit(params, x2, cfg))[:, :3], np.asarray(block_jit(params, x, cfg))[:, :3])


def _x32(shape=(1, 3, 8)):
    return np.zeros(shape, np.float32)


@pytest.mark.parametrize("call, error, message", [
    pytest.param(lambda p32, cfg: J.ode_block(p32, np.zeros((1, 3, 8)), cfg),
                 TypeError, r"x: got float64 but JAX's x64 mode is off", id="float64-x-with-x64-off"),
    pytest.param(lambda p32, cfg: J.ode_block(p32, _x32((1, 3, 7)), cfg),
                 ValueError, r"x: expected shape \(batch, seq, 8\) with batch, seq >= 1; got \(1, 3, 7\)", id="x-of-another-width"),
    pytest.param(lambda p32, cfg: J.ode_block(p32, np.zeros((1, 3, 8), np.int32), cfg),
                 TypeError, "x: expected dtype float32 or bfloat16 or float16; got int32", id="integer-x"),
    pytest.param(lambda p32, cfg: J.ode_block(p32, _x32(), cfg, np.ones((1, 2), bool)),
                 ValueError, r"padding_mask: expected shape \(1, 3\) \(batch, seq\); got \(1, 2\)",
                 id="padding-mask-of-another-length"),
    pytest.param(lambda p32, cfg: J.ode_block(p32, _x32(), cfg, np.ones((1, 3), np.int32)),
                 TypeError, "padding_mask: expected a bool jax.Array .*; got int32", id="integer-padding-mask"),
    pytest.param(lambda p32, cfg: J.ode_block({**p32, "ode_func.qkv.weight": np.zeros((8, 8), np.float32)}, _x32(), cfg),
                 ValueError, r"params\['ode_func.qkv.weight'\]: expected shape \(24, 8\); got \(8, 8\)",
                 id="parameter-of-another-shape"),
    pytest.param(lambda p32, cfg: J.ode_block(p32, _x32(), {"hidden_size": 8, "num_heads": 2, "mode": "causal"}),
                 ValueError, "mode: expected one of 'encoder', 'decoder'; got 'causal'", id="unknown-mode"),
])
def test_the_jax_block_refuses_what_the_spec_refuses(call, error, message):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    p32 = as32(R.init_params(cfg))
    with pytest.raises(error, match=message):
        call(p32, cfg)


def test_equal_variants_share_one_compilation():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=1)
    a, b = J.LocalWindowAttention(cfg, window=2), J.LocalWindowAttention(cfg, window=2)
    assert a == b and hash(a) == hash(b) and a != J.LocalWindowAttention(cfg, window=3) and a != J.SelfAttention(cfg)
    params, x = as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32)
    J.ode_block_jit._clear_cache()
    J.ode_block_jit(params, x, cfg, attention=a)
    J.ode_block_jit(params, x, cfg, attention=b)
    assert J.ode_block_jit._cache_size() == 1


ROPE = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="rk4", ode_steps=4, mode="decoder", ode_use_pe=True,
                  positional_encoding="rope")
HOPE = R.ODEConfig(hidden_size=8, num_heads=2, ode_solver="heun", ode_steps=3, ode_use_pe=True, positional_encoding="hope")


@pytest.mark.parametrize("config, change", [(ROPE, {"ode_steps": 7}), (ROPE, {"ode_solver": "rk38"}),
                                            (ROPE, {"rope_base": 500.0}), (HOPE, {"hope_base": 50.0, "ode_solver": "midpoint"})],
                         ids=["steps", "solver", "rope_base", "hope_base-solver"])
def test_a_change_of_steps_solver_or_table_field_compiles_nothing(config, change, x64):
    """ode_block_jit on concrete arrays takes the step count, the solver's coefficients (a tableau
    of the same stage count) and the tables' fields as data: the changed config runs the program
    the first call compiled, and its z(1) is the spec's at the changed config (float64's bar)."""
    import dataclasses

    changed = dataclasses.replace(config, **change)
    params = R.init_params(config, seed=0)
    x, mask, _ = make_inputs(config, params, 2, 5, seed=0, padding=True)
    J.ode_block_jit._clear_cache()
    J.ode_block_jit(params, x, config, mask)
    got = J.ode_block_jit(params, x, changed, mask)
    assert J.ode_block_jit._cache_size() == 1
    assert relative_error(np.asarray(got), R.ode_block(params, x, changed, mask)) <= 1e-12


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_shared_program_s_trajectory_is_the_static_program_s_bit_for_bit(dtype):
    """The conformance adapter's call (trajectory and f0) through the shared program on golden
    cases of a rotary, a hope and a gated config: the static program's bits (the data are the
    constants it held), in float32 and under the bfloat16 policy."""
    import ml_dtypes

    names = ("block_pos_hope_encoder_ssmax_pad_layer_norm_midpoint_b2t5h2d8", "block_rope_decoder_bitnet_pad",
             "block_layer_norm_rk2_gated_encoder_float_nopad_s4_b2t4h1d10")
    store = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    for case in (c for c in CASES if c.name in names):
        params, x = {k: v.astype(store) for k, v in case.params.items()}, case.x.astype(store)
        got = J.ode_block_jit(params, x, case.config, case.padding_mask, return_trajectory=True, return_f0=True)
        want = J.block._program(params, x, case.config, case.padding_mask, return_trajectory=True, return_f0=True)
        assert all(np.asarray(g).tobytes() == np.asarray(w).tobytes() for g, w in zip(got, want)), case.name


def test_float16_hope_is_checked_against_the_config_s_own_fields():
    """Under the half-precision policy the tables stay in the program, so its range check reads the
    call's hope fields: a config ode_block refuses in float16 is refused, one it takes is taken."""
    x = np.random.default_rng(0).normal(size=(1, 16, 8)).astype(np.float16)
    for fields, refused in (({"hope_damping": 0.0, "layer_idx": 14}, True), ({"hope_damping": 0.1}, False)):
        cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_use_pe=True, positional_encoding="hope", **fields)
        params = {k: v.astype(np.float16) for k, v in R.init_params(cfg).items()}
        for block in (J.ode_block, J.ode_block_jit):
            if refused:
                with pytest.raises(ValueError, match="hope"):
                    block(params, x, cfg)
            else:
                assert np.isfinite(np.asarray(block(params, x, cfg), np.float32)).all()


def test_jit_inside_a_trace_keeps_the_config_static_and_differentiates(x64):
    """Under jax.grad the step loop must be a scan: ode_block_jit on traced arrays is jax.jit(ode_block)."""
    params = R.init_params(ROPE, seed=1)
    x, mask, _ = make_inputs(ROPE, params, 2, 5, seed=1, padding=True)
    loss = lambda block: lambda p: jnp.sum(block(p, x, ROPE, mask) ** 2)  # noqa: E731
    got, want = jax.grad(loss(J.ode_block_jit))(params), jax.grad(loss(J.ode_block))(params)
    assert all(relative_error(np.asarray(got[k]), np.asarray(want[k])) <= 1e-12 for k in params)


def test_stage_times_are_not_in_the_state_dtype():
    """t = k / steps from an integer k: bfloat16 states do not round t = 1/3 to 0.33398."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=3)
    seen = []

    class Records(J.SelfAttention):
        def preprocess_qkv(self, q, k, v, *, t, positions, rope=None):
            seen.append(jnp.asarray(t).dtype)
            return q, k, v

    params = {k: v.astype(jnp.bfloat16) for k, v in R.init_params(cfg).items()}
    jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg, attention=Records(cfg)))(params, jnp.zeros((1, 3, 8), jnp.bfloat16))
    assert seen and all(d == jnp.float32 for d in seen)


def test_an_integer_input_is_named_by_its_own_dtype():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    with pytest.raises(TypeError, match="x: expected dtype float32 or bfloat16 or float16; got int64"):
        J.ode_block(as32(R.init_params(cfg)), np.zeros((1, 2, 8), np.int64), cfg)


@pytest.mark.parametrize("dtype, x64", [("bfloat16", False), ("float32", True)])
def test_a_variant_using_t_keeps_the_state_dtype(dtype, x64):
    """t is float32 (float64 under x64); f's output is brought back to the state's dtype."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=3)
    params = {k: v.astype(dtype) for k, v in R.init_params(cfg).items()}
    with jax.enable_x64(x64):
        z = J.ode_block(params, jnp.ones((1, 3, 8), dtype), cfg, attention=J.ScaledQueryAttention(cfg))
    assert z.dtype == jnp.dtype(dtype) and bool(jnp.isfinite(z.astype(jnp.float32)).all())


def test_a_variant_with_unhashable_settings_still_jits():
    class Gains(J.SelfAttention):
        def __init__(self, config):
            super().__init__(config)
            self.gains = [1.0, 2.0]

    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=1)
    a = Gains(cfg)
    assert a == a and a != Gains(cfg)  # by identity
    J.ode_block_jit(as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32), cfg, attention=a)


CHECKPOINT_CONFIGS = {  # the gated solver (its gate is a parameter), BitLinear, RoPE, padded: one compilation
    "rk2_gated_bitnet_decoder": dict(ode_solver="rk2_gated", ode_steps=3, use_bitnet=True, mode="decoder",
                                     norm_type="dynamic_tanh", ode_use_pe=True, positional_encoding="rope"),
    # four evaluations per step over three steps, ALiBi, padded
    "rk4_alibi_decoder": dict(ode_solver="rk4", ode_steps=3, mode="decoder", norm_type="layer_norm",
                              ode_use_pe=True, positional_encoding="alibi"),
}
def checkpoint_case(name, dtype="float32"):
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, **CHECKPOINT_CONFIGS[name])
    params = {k: v.astype(dtype) for k, v in R.init_params(cfg, 3, perturb_norms=True).items()}
    x = np.random.default_rng(0).normal(size=(2, 5, 8)).astype(dtype)
    mask = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    return cfg, params, x, mask


def trajectory_loss(params, x, cfg, mask, checkpoint):
    z, trajectory = J.ode_block(params, x, cfg, mask, return_trajectory=True, checkpoint=checkpoint)
    return jnp.sum(z**2) + jnp.sum(trajectory)


def grads_both_ways(grad, *case):
    """(plain, checkpointed): the gradients wrt (every parameter, x), as flat lists of arrays."""
    return [[np.asarray(g) for g in jax.tree.leaves(grad(*case, checkpoint))] for checkpoint in (False, True)]


@pytest.mark.parametrize("name", CHECKPOINT_CONFIGS)
def test_checkpoint_same_forward_and_gradients_within_roundings(name):
    """The forward is equal bit for bit. The gradients are not, for two reasons:
    JAX transposes the plain scan's step and the checkpointed step (a remat) as different
    sequences of additions: a parameter's cotangent is a running sum over every evaluation in the
    plain scan, the step's evaluations summed first, then added, under jax.checkpoint (this shows
    op by op, under jax.disable_jit, from two steps of a multi-stage solver on); and XLA compiles
    the forward recomputed inside the backward loop into other fusions than the forward loop's,
    and on CPU it contracts a multiply and an add in one fusion into a fused multiply-add, so the
    same formula rounds differently (this shows from one step on, and an optimization_barrier
    does not stop it: XLA CPU expands barriers before fusion).

    So the checkpointed gradient is the same float computation summed in another order, and it is
    held to the conformance suite's bound for exactly that (conformance/cases/tolerance.py): each
    gradient's own float32 error e32 (the plain float32 gradient against the plain float64 one),
    times SAFETY, in float32 and rescaled to float64; the largest difference seen is 2.97 e32
    against the bound's 32 (measured at XLA's default LLVM level; the suite compiles at level 0).
    A bound of a few epsilon of the largest entry is not one: the gate
    bias's gradient is a sum over every token and step that partly cancels, so its two orders
    differ by more than that. A wrong gradient would differ by O(1)."""
    grads = {}
    for dtype in ("float32", "float64"):
        with jax.enable_x64(dtype == "float64"):
            cfg, params, x, mask = checkpoint_case(name, dtype)
            if dtype == "float32":  # one precision is enough for the forward (two compilations each)
                forward = [np.asarray(J.ode_block_jit(params, x, cfg, mask, checkpoint=c)) for c in (False, True)]
                assert forward[0].dtype == dtype and np.array_equal(*forward)
            grad = jax.jit(jax.grad(trajectory_loss, argnums=(0, 1)), static_argnames=("cfg", "checkpoint"))
            grads[dtype] = grads_both_ways(grad, params, x, cfg, mask)
    (plain32, checkpointed32), (plain64, checkpointed64) = grads["float32"], grads["float64"]
    assert len(plain32) == len(params) + 1
    for p32, c32, p64, c64 in zip(plain32, checkpointed32, plain64, checkpointed64):
        e32 = relative_error(p32, p64)
        assert np.abs(p64).sum() > 0 and p32.dtype == "float32" and p64.dtype == "float64"
        assert relative_error(c32, p32) <= tolerance(e32, "float32")
        assert relative_error(c64, p64) <= tolerance(e32, "float64")


def test_checkpoint_keeps_the_compiled_gradient_flat_in_steps():
    """temp_size_in_bytes of the compiled forward+backward (odeattn.bench's measure), per step at
    this shape, rk4: checkpointed, about 2 states (the step's input, kept for its recomputation,
    and as much again in XLA's buffer assignment of the scan), where the plain scan keeps the four
    evaluations' activations, attention weights included."""
    from odeattn.bench import jax_train_program

    batch, seq, d_model = 1, 16, 16
    state = batch * seq * d_model * 4  # bytes of one float32 state z(t)
    temp = {}
    for checkpoint in (False, True):
        for steps in (1, 8):
            cfg = R.ODEConfig(hidden_size=d_model, num_heads=2, ode_solver="rk4", ode_steps=steps)
            x = np.zeros((batch, seq, d_model), np.float32)
            temp[checkpoint, steps] = jax_train_program(cfg, as32(R.init_params(cfg)), x, checkpoint)[1].temp_size_in_bytes
    plain, checkpointed = ((temp[c, 8] - temp[c, 1]) / 7 / state for c in (False, True))
    assert plain >= 20
    assert checkpointed <= 3


@pytest.mark.parametrize("index", [0, 3, 9])
def test_return_f0_is_f_at_0_and_the_block_is_unchanged(x64, index):
    """f(0, x) read off the first stage equals ode_func's, and z(1) and the trajectory are the ones
    without it: the conformance adapter's one program for a case's f0 and trajectory."""
    case = CASES[index]
    z1, trajectory = J.ode_block(case.params, case.x, case.config, case.padding_mask, return_trajectory=True)
    got = J.ode_block(case.params, case.x, case.config, case.padding_mask, return_trajectory=True, return_f0=True)
    assert len(got) == 3 and np.array_equal(got[0], z1) and np.array_equal(got[1], trajectory)
    f0 = J.ode_func(case.params, 0.0, case.x, case.config, case.padding_mask)
    assert relative_error(np.asarray(got[2]), np.asarray(f0)) <= 1e-13
    alone = J.ode_block(case.params, case.x, case.config, case.padding_mask, return_f0=True)
    assert np.array_equal(alone[0], z1) and np.array_equal(alone[1], got[2])


def test_checkpoint_option_is_checked_by_name():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    with pytest.raises(TypeError, match=r"checkpoint: expected True or False; got 'yes' \(str\)"):
        J.ode_block(as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32), cfg, checkpoint="yes")
    with pytest.raises(TypeError, match=r"return_f0: expected True or False; got 1 \(int\)"):
        J.ode_block(as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32), cfg, return_f0=1)


# ---- cached decoding: what the JAX decode step promises (its agreement: tests/backends/test_cache.py)
DECODE_CFG = R.ODEConfig(hidden_size=12, num_heads=3, mode="decoder", ode_solver="heun", ode_steps=2, use_bitnet=True,
                         norm_type="derf", ode_use_pe=True, positional_encoding="rope")


def test_decode_step_compiles_once_for_every_position():
    prompt, decoded = 5, 3
    params = R.init_params(DECODE_CFG, seed=1, perturb_norms=True)
    x, mask, _ = make_inputs(DECODE_CFG, params, 3, prompt + decoded, seed=1, padding=True, decoded=decoded)
    before = J.block._decode._cache_size()
    z, cache = J.prefill(params, x[:, :prompt].astype("float32"), DECODE_CFG, mask[:, :prompt], max_len=prompt + decoded)
    out = [np.asarray(z)]
    for i in range(prompt, prompt + decoded):
        z_t, cache = J.decode_step(params, x[:, i:i + 1].astype("float32"), cache, DECODE_CFG)
        out.append(np.asarray(z_t))
    got, want = np.concatenate(out, axis=1), R.ode_block(params, x, DECODE_CFG, mask)
    assert J.block._decode._cache_size() == before + 1
    assert relative_error(got, want) <= 1e-5


@pytest.mark.parametrize("solver", ["euler", "rk2_gated", "rk4"])
def test_the_prefill_holds_one_evaluation_whatever_the_steps_and_stages(count_primitive, solver):
    """Its program holds f once (2 BitLinear activation roundings; the two weights' outside the
    loop): its evaluations are a scan whose outputs are each evaluation's K and V."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder", ode_steps=3, use_bitnet=True, ode_solver=solver)
    jaxpr = jax.make_jaxpr(lambda p, x: J.prefill(p, x, cfg, max_len=4))(as32(R.init_params(cfg)), np.zeros((1, 3, 8), np.float32))
    assert count_primitive(jaxpr.jaxpr, "round", skip_scan=True) == 2 and count_primitive(jaxpr.jaxpr, "round") == 4


def test_decode_step_refuses_a_traced_cache():
    params = R.init_params(DECODE_CFG)
    _, cache = J.prefill(params, np.zeros((1, 2, 12), np.float32), DECODE_CFG, max_len=4)
    with pytest.raises(TypeError, match="cache: decode_step runs outside jit"):
        jax.jit(lambda c: J.decode_step(params, np.zeros((1, 1, 12), np.float32), c, DECODE_CFG))(cache)


LONG = 65_536


@pytest.mark.parametrize("call", ["ode_block", "ode_block_jit", "ode_func", "prefill-max_len-1e9"])
def test_what_cannot_fit_is_refused_before_compiling(call, monkeypatch):
    """T = 65,536 was a RESOURCE_EXHAUSTED (one head's scores per tile: 3 x 16 GiB float32); a
    prefill of 10^9 slots was accepted and failed only on use. Refused from the shapes, under jit
    too (shapes are static), with the machine's physical memory as the limit."""
    from ode_ref.memory import LIMIT_VARIABLE, MemoryLimitError

    monkeypatch.delenv(LIMIT_VARIABLE, raising=False)
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, mode="decoder")
    params = as32(R.init_params(cfg))
    x = np.zeros((1, LONG, 8), np.float32)
    calls = {"ode_block": lambda: J.ode_block(params, x, cfg), "ode_block_jit": lambda: block_jit(params, x, cfg),
             "ode_func": lambda: J.ode_func(params, 0.0, x, cfg),
             "prefill-max_len-1e9": lambda: J.prefill(params, x[:, :3], cfg, max_len=10**9)}
    what = "the KV cache" if call.startswith("prefill") else "the attention scores of a tile of 1 head, 3 x (1, 1, 65536, 65536)"
    with pytest.raises(MemoryLimitError, match=rf"^(ode_block|ode_func|prefill): x of shape .* \({re.escape(what)}.*"
                                               r"more than the memory limit of .* \(the machine's physical memory"):
        calls[call]()


@pytest.mark.parametrize("case", ["untiled", "tiled", "alibi-tiled"])
def test_the_estimate_is_xlas_compiled_temporaries(case):
    """The compiled block's temporaries (memory_analysis) against check_jax_memory: within
    [0.75, 1.5] of them (measured 1.04 untiled, 1.41 tiled, 1.15 tiled with ALiBi, whose bias is
    held twice, with its heads-first copy; 1.46 for a padded decoder, where XLA keeps two score
    arrays, not three)."""
    from odeattn.backends.jax.block import check_jax_memory

    encoding = "alibi" if case == "alibi-tiled" else "none"
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=2, ode_use_pe=encoding != "none",
                      positional_encoding="alibi" if encoding == "alibi" else "rope")
    params, seq = as32(R.init_params(cfg)), 1024  # one head's scores: 4 MiB, the default tile
    x = np.zeros((1, seq, 8), np.float32)
    attention = J.SelfAttention(cfg).with_tiles(2**40) if case == "untiled" else J.SelfAttention(cfg)
    compiled = block_jit.lower(params, x, cfg, attention=attention).compile()
    temporaries = compiled.memory_analysis().temp_size_in_bytes
    estimate = check_jax_memory("ode_block", cfg, attention, jnp.asarray(x))
    assert 0.75 <= estimate / temporaries <= 1.5, (estimate, temporaries)


def test_a_half_input_compiles_once_more_and_leaves_float32_as_it_was():
    """The policy is chosen from x's dtype while tracing: a bfloat16 input is one compilation of
    its own, the float32 program has no half-precision conversion in it (its jaxpr is the one
    before the policy existed, checked once by hand), and z(1) comes back in the input's dtype."""
    cfg = R.ODEConfig(hidden_size=8, num_heads=2, ode_steps=1)
    params, x = as32(R.init_params(cfg)), np.ones((1, 3, 8), np.float32)
    jaxpr = str(jax.make_jaxpr(lambda p, x: J.ode_block(p, x, cfg))(params, x))
    assert "bf16" not in jaxpr and "f16" not in jaxpr.replace("bf16", "")
    J.ode_block_jit._clear_cache()
    assert J.ode_block_jit(params, x, cfg).dtype == jnp.float32
    assert J.ode_block_jit(params, x.astype(jnp.bfloat16), cfg).dtype == jnp.bfloat16
    J.ode_block_jit(params, x, cfg)
    assert J.ode_block_jit._cache_size() == 2


def test_a_float8_input_is_refused_by_the_spec_message():
    cfg = R.ODEConfig(hidden_size=8, num_heads=2)
    with pytest.raises(TypeError, match="x: expected dtype float32 or bfloat16 or float16; got float8_e4m3fn"):
        J.ode_block(as32(R.init_params(cfg)), np.zeros((1, 2, 8), jnp.float8_e4m3fn), cfg)
