"""One training step of ODE blocks under DistributedDataParallel (gloo, 2 processes on
localhost, half the batch each) equals a single-process step on the full batch."""

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not (dist.is_available() and dist.is_gloo_available()):
    pytest.skip("torch.distributed with the gloo backend is not available in this torch build", allow_module_level=True)

import torch.multiprocessing as mp  # noqa: E402

import ode_ref as R  # noqa: E402
from odeattn.backends.torch.distributed import (  # noqa: E402
    data_parallel, host_store, ode_model, process_group, sgd_step,
)
from odeattn.conformance.cases.tolerance import relative_error  # noqa: E402

WORLD, LR = 2, 0.1
CONFIG = R.ODEConfig(hidden_size=16, num_heads=4, ode_solver="rk4", ode_steps=2, mode="decoder",
                     ode_use_pe=True, positional_encoding="rope")

# DDP sums the two halves' gradients in an all-reduce and divides by 2; one process sums the
# full batch's terms in another order: about one float64 rounding (2.7e-16 relative at most, per
# parameter). 1e-13 stays far below a gradient averaged wrongly (a half missing or not divided by
# 2 is an O(1) error).
TOL = 1e-13


def model_and_batch():
    """(the model with seeded weights, x (4, 5, 16), target (4, 5, 3)), float64."""
    torch.manual_seed(0)
    model = ode_model(CONFIG, layers=2, out_features=3).double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 5, CONFIG.hidden_size, generator=g, dtype=torch.float64)
    return model, x, torch.randn(4, 5, 3, generator=g, dtype=torch.float64)


def state(model):
    """{name: (parameter after the step, its gradient)} as NumPy arrays."""
    return {n: (p.detach().numpy().copy(), p.grad.numpy().copy()) for n, p in model.named_parameters()}


def one_step(rank):
    """Rank rank's DDP step on its half of the batch: the arrays it ends with. The DDP model
    goes when this returns, before the group is torn down."""
    model, x, target = model_and_batch()
    ddp, sizes = data_parallel(model)
    rows = slice(rank * 2, rank * 2 + 2)
    loss = sgd_step(ddp, x[rows], target[rows], LR)
    arrays = {f"param/{n}": p for n, (p, _) in state(model).items()}
    arrays.update({f"grad/{n}": g for n, (_, g) in state(model).items()})
    return dict(loss=loss, allreduce_sizes=np.asarray(sizes), **arrays)


def worker(rank, port, out_dir):
    """Rank rank: one DDP step; writes out_dir/rank{rank}.npz."""
    torch.set_num_threads(1)
    with process_group(rank, WORLD, port):
        np.savez(f"{out_dir}/rank{rank}.npz", **one_step(rank))


# the fixtures below once: every test of this file in one test process (pytest-xdist); their scope is
# the session, as a module-scoped one is torn down and built again when the process runs another file between
pytestmark = pytest.mark.xdist_group("backends/torch/test_distributed")


@pytest.fixture(scope="session")
def ranks(tmp_path_factory):
    """[the arrays rank 0 wrote, rank 1's]."""
    out = tmp_path_factory.mktemp("ddp")
    store = host_store(WORLD)  # held here until both ranks have exited
    ranks = mp.spawn(worker, args=(store.port, str(out)), nprocs=WORLD, join=False)
    deadline = time.monotonic() + 180  # the step takes seconds; a rank that waits forever fails the test
    while not ranks.join(timeout=1):
        if time.monotonic() > deadline:
            for process in ranks.processes:
                process.terminate()
            pytest.fail("the DDP ranks did not finish in 180 s")
    result = []
    for r in range(WORLD):
        with np.load(out / f"rank{r}.npz", allow_pickle=False) as data:
            result.append({k: data[k] for k in data.files})
    return result


def test_ddp_step_equals_single_process_step_on_the_full_batch(ranks):
    model, x, target = model_and_batch()
    sgd_step(model, x, target, LR)
    want = state(model)
    errs = {}
    for n, (param, grad) in want.items():
        errs[f"grad/{n}"] = relative_error(ranks[0][f"grad/{n}"], grad)
        errs[f"param/{n}"] = relative_error(ranks[0][f"param/{n}"], param)
    assert len(want) == 2 * 4 + 2  # per block qkv, out_proj, the norm's weight and bias; the head's two
    assert max(errs.values()) <= TOL, {k: v for k, v in errs.items() if v > TOL}
    # the step moved every parameter: a step that changed nothing could not match by accident
    before = {n: p.detach().numpy() for n, p in model_and_batch()[0].named_parameters()}
    assert all(relative_error(ranks[0][f"param/{n}"], p) > 1e-4 for n, p in before.items())


def test_both_ranks_hold_the_same_parameters_after_the_step(ranks):
    params = [k for k in ranks[0] if k.startswith("param/")]
    assert params and all(np.array_equal(ranks[0][k], ranks[1][k]) for k in params)
    assert ranks[0]["loss"] != ranks[1]["loss"]  # each saw its own half of the batch


def test_one_allreduce_of_every_gradient_per_step(ranks):
    model = model_and_batch()[0]
    n_params = sum(p.numel() for p in model.parameters())
    assert ranks[0]["allreduce_sizes"].sum() == n_params
