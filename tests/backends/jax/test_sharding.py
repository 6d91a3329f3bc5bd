"""ode_block and its gradient sharded over 2 host devices (jax.sharding) equal the unsharded
results: data parallel (x split by batch rows) and head parallel (the qkv and out_proj weights
split by heads). XLA's host device count is read once, when JAX starts, so the sharded run is a
process of its own (sharded_run.py); the unsharded reference runs here, on this process's one
device."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from odeattn.backends.jax import sharding as S  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402

SCRIPT = Path(__file__).with_name("sharded_run.py")
sys.path.insert(0, str(SCRIPT.parent))
import sharded_run  # noqa: E402

# Sharding splits sums: the out_proj product is added up from each device's heads, and the
# parameters' gradients from each device's batch rows, in another order than on one device. The
# largest reordering error is 1.4e-14 relative (head parallel, gate.bias's gradient: one number
# summed over every token and stage, whose terms partly cancel); 1e-12 stays far below any wrong
# result (a lost head or batch row, or a gradient summed twice, is an O(1) error).
TOL = 1e-12


def unsharded_results():
    """{case name: (z(1), grads by parameter name, grad x)}, unsharded, on one device."""
    out = {}
    with jax.enable_x64(True):
        fn = jax.jit(sharded_run.value_and_grads, static_argnums=(0, 5))
        for name, cfg, params, x, mask, w in sharded_run.cases():
            z, g_p, g_x = fn(sharded_run.ode_block, params, x, mask, w, cfg)
            assert len(z.sharding.device_set) == 1
            out[name] = np.asarray(z), {k: np.asarray(v) for k, v in g_p.items()}, np.asarray(g_x)
    return out


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("backends/jax/test_sharding")


@pytest.fixture(scope="session")
def runs(tmp_path_factory):
    """(arrays, report) of sharded_run.py in a process with 2 host devices, and the unsharded
    results computed here meanwhile."""
    out = tmp_path_factory.mktemp("sharded") / "sharded.npz"
    env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.Popen([sys.executable, str(SCRIPT), str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        reference = unsharded_results()
    finally:
        _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    with np.load(out, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "report"}
        return (arrays, json.loads(str(data["report"]))), reference


@pytest.fixture(scope="session")
def sharded(runs):
    return runs[0]


@pytest.fixture(scope="session")
def unsharded(runs):
    return runs[1]


def errors(arrays, unsharded, layout):
    """{case/quantity: relative error of the sharded result against the unsharded one}; for
    batch_psum the parameters' gradients only."""
    errs = {}
    for name, (z, g_p, g_x) in unsharded.items():
        if layout != "batch_psum":
            errs[f"{name}/z"] = relative_error(arrays[f"{name}/{layout}/z"], z)
            errs[f"{name}/grad/x"] = relative_error(arrays[f"{name}/{layout}/grad/x"], g_x)
        for k, g in g_p.items():
            errs[f"{name}/grad/{k}"] = relative_error(arrays[f"{name}/{layout}/grad/{k}"], g)
    return errs


@pytest.mark.parametrize("layout", [S.BATCH, S.HEADS, "batch_psum"])
def test_sharded_forward_and_gradient_equal_unsharded(sharded, unsharded, layout):
    errs = errors(sharded[0], unsharded, layout)
    quantities = len(next(iter(unsharded.values()))[1]) + (0 if layout == "batch_psum" else 2)
    assert len(errs) == len(unsharded) * quantities
    assert max(errs.values()) <= TOL, {k: v for k, v in errs.items() if v > TOL}


def test_arrays_are_split_over_the_two_devices(sharded):
    report = sharded[1]
    for name, cfg, params, x, mask, w in sharded_run.cases():
        batch, heads = report[f"{name}/batch"]["shards"], report[f"{name}/heads"]["shards"]
        assert batch["x"] == [x.shape[0] // 2, *x.shape[1:]]
        assert all(batch[k] == list(v.shape) for k, v in params.items())  # replicated
        d, h = cfg.hidden_size, cfg.num_heads
        assert heads["ode_func.qkv.weight"] == [3, h // 2, d // h, d]  # whole heads of q, k and v
        assert heads["ode_func.out_proj.weight"] == [d, d // 2]
        assert heads["x"] == list(x.shape)


def test_each_layout_compiles_to_its_stated_collectives(sharded):
    """What each layout communicates, read from the compiled programs (sharding.py says why)."""
    for name, cfg, params, x, mask, w in sharded_run.cases():
        batch, heads = sharded[1][f"{name}/batch"], sharded[1][f"{name}/heads"]
        n_params = sum(v.size for v in params.values())
        gate = {"gate.weight", "gate.bias"}
        # jit: the gradients all-reduced inside the backward loops, an ode_func parameter's share
        # once per evaluation of f (the program holds one: the stages are a loop), the gate's once
        # per step
        per_eval, per_step = sorted(batch["with_grad"], key=lambda c: -c["elements"])
        assert all(c["op"] == "all-reduce" and c["in_loop"] for c in (per_eval, per_step))
        assert sorted(per_eval["shapes"]) == sorted(list(v.shape) for k, v in params.items() if k not in gate)
        assert sorted(per_step["shapes"]) == sorted(list(params[k].shape) for k in gate)
        # batch_parallel_grad: one all-reduce of the parameters' gradients, after the loop
        (reduce,) = sharded[1][f"{name}/batch_psum"]["with_grad"]
        assert (reduce["op"], reduce["elements"], reduce["in_loop"]) == ("all-reduce", n_params, False)
        # heads: one all-reduce of out_proj's partial sums in the one evaluation of f
        activation = [x.shape[0], x.shape[1], cfg.hidden_size]
        ops = [(c["op"], c["shapes"], c["in_loop"]) for c in heads["forward"]]
        weight = ("all-gather", [[3, cfg.num_heads, cfg.head_dim, cfg.hidden_size]], False)
        assert ops == [("all-reduce", [activation], True), weight]  # the qkv weight, gathered before the loop (sharding.py)
        # with the gradient: the same forward and backward, and the q, k and v activations
        # gathered once in the backward loop's evaluation
        ops = [(c["op"], c["shapes"], c["in_loop"]) for c in heads["with_grad"]]
        qkv = ("all-gather", [[x.shape[0], x.shape[1], 3, cfg.num_heads, cfg.head_dim]], True)
        assert sorted(ops) == sorted([("all-reduce", [activation], True)] * 2 + [qkv, weight])
        # attention over tiles of one head loops over the heads only: split by batch rows, it still
        # communicates nothing in the forward (a loop over a split axis would gather q, k and v at
        # every evaluation); split by heads, what the untiled forward does
        assert batch["tiled_forward"] == [] and heads["tiled_forward"] == heads["forward"]
    # These counts are XLA's choices at the pinned JAX version.
