"""A call of the block through each deployment target this project writes, side by side in one
run: the jax.export program (export/jax_program.py), the ONNX file in ONNX Runtime, in
OpenVINO (its float32 hint, as the openvino backend) and in tract, and compiled by IREE for this CPU, the
AOTInductor package (export/aoti_program.py), the ExecuTorch program (export/executorch_program.py,
portable operators), the LiteRT model (export/litert_program.py, at the call's shape), the torch port's
program after torch.export (Core ATen; run here by torch itself) and the torch port eager. Each path's build
(its artifact's export and its runtime's load or compilation, to its first call's result) is timed
once, with its error against the spec in float64, before the calls are.

    python benchmarks/deploy_targets.py [--rounds 7] [--calls 20] [--threads 1]

It needs `[all]` and the `executorch` and `litert` extras (outside `[all]`), and a C++ compiler for AOTInductor.

The block is issue 62's: d_model 32, 4 heads, rk4 x 2 steps, float32, batch 2 x seq 8, the second
row's last 3 tokens padded. Method (as benchmarks/opset_forms.py): rounds, each path called once
to wake its threads, then `calls` timed calls, the median per round; each path's time is printed
as the median over the rounds with its min..max, and its ratio to ONNX Runtime within a round.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import ode_ref as R
from odeattn.bench.timing import interleaved_times
from odeattn.conformance.cases.tolerance import relative_error


def paths(threads: int):
    """({path: a zero-argument callable}, {path: its error against the spec}, {path: its build in
    seconds: from the config and weights to its first call's result, the artifact's export, its
    runtime's load or compilation and that call included, as a deployer first meets it})."""
    import jax
    import torch
    from jax import export

    from odeattn.backends.torch import ODEAttentionBlock
    from odeattn.export.aoti_program import aoti_runner, export_aoti_block
    from odeattn.export.block import export_model
    from odeattn.export.executorch_program import executorch_runner, export_executorch_block
    from odeattn.export.iree_program import compile_iree
    from odeattn.export.jax_program import export_jax_block
    from odeattn.export.litert_program import export_litert_block, litert_runner
    from odeattn.export.options import ExportOptions
    from odeattn.export.runtime import session
    from odeattn.export.standalone import load, load_onnx

    torch.set_num_threads(threads)
    cfg = R.ODEConfig(hidden_size=32, num_heads=4, ode_solver="rk4", ode_steps=2)
    params = R.init_params(cfg, seed=0, perturb_norms=True)
    x = np.random.default_rng(0).normal(size=(2, 8, 32))
    mask = np.ones((2, 8), bool)
    mask[1, 5:] = False
    x32 = x.astype(np.float32)
    want = R.ode_block(params, x, cfg, mask)
    feed = {"x": x32, "padding_mask": mask}
    xt, mt = torch.as_tensor(x32), torch.as_tensor(mask)
    onnx_model = lambda: export_model(cfg, params, ExportOptions())  # noqa: E731  (the default file, in each build)

    def jax_export():
        call = jax.jit(export.deserialize(bytearray(export_jax_block(cfg, params))).call)
        return lambda: np.asarray(call(x32, mask))

    def onnxruntime():
        ort = session(onnx_model(), threads=threads)
        return lambda: ort.run(None, feed)[0]

    def openvino():
        run = load_onnx("openvino", onnx_model(), threads)  # the float32 hint
        return lambda: run(feed)["z"]

    def iree():
        run = load("iree", compile_iree(onnx_model()), ["x", "padding_mask"], ["z"], threads)
        return lambda: run(feed)["z"]

    def tract():
        run = load_onnx("tract", onnx_model())  # tract runs a model on the calling thread
        return lambda: run(feed)["z"]

    def runner(make):
        run = make()
        return lambda: run(x32, mask)

    def core_aten():
        core = torch.export.export(ODEAttentionBlock.from_params(cfg, params), (xt,), {"padding_mask": mt})
        module = core.run_decompositions().module()
        return lambda: module(xt, padding_mask=mt).detach().numpy()

    def torch_eager():
        block = ODEAttentionBlock.from_params(cfg, params)
        return lambda: block(xt, padding_mask=mt).detach().numpy()

    builds = {"jax.export": jax_export, "onnxruntime": onnxruntime, "openvino": openvino, "iree": iree, "tract": tract,
              "AOTInductor package": lambda: runner(lambda: aoti_runner(export_aoti_block(cfg, params))),
              "ExecuTorch program": lambda: runner(lambda: executorch_runner(export_executorch_block(cfg, params))),
              "LiteRT model": lambda: runner(lambda: litert_runner(export_litert_block(cfg, params, batch=2, seq=8),
                                                                   threads=threads)),
              "torch.export (Core ATen)": core_aten, "torch eager": torch_eager}
    fns, errors, seconds = {}, {}, {}
    for k, build in builds.items():
        start = time.perf_counter()
        fns[k] = build()
        with torch.no_grad():  # as the timed calls run
            errors[k] = relative_error(fns[k](), want)
        seconds[k] = time.perf_counter() - start
    return fns, errors, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    if args.threads == 1:  # XLA's CPU threads, set before jax is imported: one, as the other paths'
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                                   "intra_op_parallelism_threads=1").strip()
    import torch

    fns, errors, seconds = paths(args.threads)
    with torch.no_grad():
        times = interleaved_times(fns, repeats=args.rounds, burst=args.calls)
    rounds = {k: [statistics.median(t[i * args.calls:(i + 1) * args.calls]) for i in range(args.rounds)]
              for k, t in times.items()}
    print(f"{args.threads} thread(s), {args.rounds} rounds of {args.calls} calls; a call's median over the rounds (min..max)")
    print("| path | error vs the spec | build (s) | a call (ms) | / onnxruntime |")
    print("|---|---|---|---|---|")
    for k, r in rounds.items():
        ratio = [a / b for a, b in zip(r, rounds["onnxruntime"])]
        print(f"| {k} | {errors[k]:.1e} | {seconds[k]:.2f} | {statistics.median(r) * 1e3:.3f} ({min(r) * 1e3:.3f}..{max(r) * 1e3:.3f}) | "
              f"{statistics.median(ratio):.2f} ({min(ratio):.2f}..{max(ratio):.2f}) |")


if __name__ == "__main__":
    main()
