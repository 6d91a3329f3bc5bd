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
from odeattn.conformance.tolerance import relative_error  # noqa: E402

SCRIPT = Path(__file__).with_name("sharded_run.py")
sys.path.insert(0, str(SCRIPT.parent))
import sharded_run  # noqa: E402

# Sharding splits sums: the out_proj product is added up from each device's heads, and the
# parameters' gradients from each device's batch rows, in another order than on one device.
# Measured (relative error, per array): forward 5e-19 (batch) and 1.3e-16 (heads); gradients
# <= 1.1e-15 (batch) and <= 1.4e-14 (heads), the largest gate.bias's, one number summed over
# every token and stage, whose terms partly cancel. Bound 1e-12: ~70x the largest reordering
# error, and far below any wrong result (a lost head or batch row is an O(1) error).
TOL = 1e-12


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(arrays, report) of sharded_run.py in a process with 2 host devices."""
    out = tmp_path_factory.mktemp("sharded") / "sharded.npz"
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(out)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with np.load(out, allow_pickle=False) as data:
        arrays = {k: data[k] for k in data.files if k != "report"}
        return arrays, json.loads(str(data["report"]))


@pytest.fixture(scope="module")
def unsharded():
    """{case name: (z(1), grads by parameter name, grad x)} on one device."""
    assert jax.device_count() == 1
    out = {}
    with jax.enable_x64(True):
        fn = jax.jit(sharded_run.value_and_grads, static_argnums=(0, 5))
        for name, cfg, params, x, mask, w in sharded_run.cases():
            z, g_p, g_x = fn(sharded_run.ode_block, params, x, mask, w, cfg)
            out[name] = np.asarray(z), {k: np.asarray(v) for k, v in g_p.items()}, np.asarray(g_x)
    return out


def errors(arrays, unsharded, layout):
    """{case/quantity: relative error of the sharded result against the unsharded one}."""
    errs = {}
    for name, (z, g_p, g_x) in unsharded.items():
        errs[f"{name}/z"] = relative_error(arrays[f"{name}/{layout}/z"], z)
        errs[f"{name}/grad/x"] = relative_error(arrays[f"{name}/{layout}/grad/x"], g_x)
        for k, g in g_p.items():
            errs[f"{name}/grad/{k}"] = relative_error(arrays[f"{name}/{layout}/grad/{k}"], g)
    return errs


@pytest.mark.parametrize("layout", [S.BATCH, S.HEADS])
def test_sharded_forward_and_gradient_equal_unsharded(sharded, unsharded, layout):
    errs = errors(sharded[0], unsharded, layout)
    assert len(errs) == len(unsharded) * (2 + len(next(iter(unsharded.values()))[1]))
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


def test_collectives_are_the_expected_ones(sharded):
    """What each layout communicates, read from the compiled programs (README, Beyond one machine)."""
    for name, cfg, params, x, mask, w in sharded_run.cases():
        batch, heads = sharded[1][f"{name}/batch"], sharded[1][f"{name}/heads"]
        assert batch["forward"] == []  # each device runs its own rows
        (reduce,) = batch["with_grad"]  # the parameters' gradients, one fused all-reduce
        assert reduce["op"] == "all-reduce" and reduce["elements"] >= sum(v.size for v in params.values())
        stages = 2  # rk2_gated: one all-reduce of out_proj's partial sums per evaluation of f
        activation = [x.shape[0], x.shape[1], cfg.hidden_size]
        ops = [(c["op"], c["shapes"], c["in_loop"]) for c in heads["forward"]]
        assert ops.count(("all-reduce", [activation], True)) == stages
        assert ops[stages:] == [("all-gather", [[3, cfg.num_heads, cfg.head_dim, cfg.hidden_size]], False)]
