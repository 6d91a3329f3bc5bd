"""ONNX Runtime on the CPU: which form of attention an opset 23 export should use, and opset 23
against opset 17 for the whole block. The figures in export/attention.py (SelfAttention.attn)
come from this script.

    python benchmarks/opset_forms.py forms --shape small [--padding-mask] [--rounds 21 --calls 20]
    python benchmarks/opset_forms.py block --shape large [--padding-mask] [--rounds 9 --calls 2]

forms: one attention alone, as a small model in each candidate form, inputs q, k, v
(batch, seq, d_model): opset 17's form (Reshape to (batch, seq, heads, head_dim), Transpose,
MatMul, Mul by the scale, [Where on a bool mask], Softmax, MatMul, Transpose, Reshape); Attention
on the 3D inputs [with an additive float mask]; Attention on 4D (batch, heads, seq, head_dim)
inputs, transposed around the node; and opset 17's form in an opset 23 model. block: the exported
block (rk4, 4 steps, export_model) at opset 17 and 23.

Method: the machine's speed drifts, so the paths are timed in rounds; each round runs every path
once in turn (reversed every other round), each as one call to wake the runtime's threads, then
`calls` timed calls, whose median is the path's time for the round. The speed of a path against
the first is the ratio of their times within each round; the median of those ratios is printed
with their min..max over the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import onnx
from onnx import TensorProto, helper

import ode_ref as R
from odeattn.conformance.cases.tolerance import relative_error, tolerance
from odeattn.export.attention import FLOAT_MIN
from odeattn.export.block import export_model
from odeattn.export.runtime import session

SHAPES = {"small": (1, 128, 256, 8), "large": (8, 512, 512, 8)}  # B, T, D, H: odeattn bench's


def _attention_model(form: str, shape, masked: bool) -> onnx.ModelProto:
    """One attention in `form` (composed17, attention3d, attention4d, composed23)."""
    _, _, d, h = shape
    hd = d // h
    scale = hd ** -0.5
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", "seq", d]) for n in "qkv"]
    inits = [helper.make_tensor("heads", TensorProto.INT64, [4], [0, 0, h, hd]),
             helper.make_tensor("merged", TensorProto.INT64, [3], [0, 0, d])]
    split = [helper.make_node("Reshape", [a, "heads"], [a + "4"]) for a in "qkv"]
    merge = [helper.make_node("Transpose", ["y4"], ["yt"], perm=[0, 2, 1, 3]), helper.make_node("Reshape", ["yt", "merged"], ["y"])]
    mask = ["mask"] if masked else []
    if form.startswith("composed"):
        inits += [helper.make_tensor("scale", TensorProto.FLOAT, [], [scale]), helper.make_tensor("fill", TensorProto.FLOAT, [], [FLOAT_MIN])]
        nodes = split + [
            helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3]),
            helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1]),
            helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3]),
            helper.make_node("MatMul", ["qt", "kt"], ["s0"]),
            helper.make_node("Mul", ["s0", "scale"], ["s"]),
        ]
        if masked:
            nodes.append(helper.make_node("Where", ["mask", "s", "fill"], ["s_masked"]))
        nodes += [helper.make_node("Softmax", ["s_masked" if masked else "s"], ["p"], axis=-1),
                  helper.make_node("MatMul", ["p", "vt"], ["y4"])] + merge
        mask_info = [helper.make_tensor_value_info("mask", TensorProto.BOOL, ["batch", 1, 1, "seq"])]
        opset = 17 if form == "composed17" else 23
    else:
        if form == "attention3d":
            nodes = [helper.make_node("Attention", ["q", "k", "v"] + mask, ["y"], scale=scale, q_num_heads=h, kv_num_heads=h)]
        else:
            nodes = split + [helper.make_node("Transpose", [a + "4"], [a + "t"], perm=[0, 2, 1, 3]) for a in "qkv"]
            nodes += [helper.make_node("Attention", ["qt", "kt", "vt"] + mask, ["y4"], scale=scale)] + merge
        mask_info = [helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", 1, "seq", "seq"])]
        opset = 23
    graph = helper.make_graph(nodes, form, inputs + (mask_info if masked else []),
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", d])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(model, full_check=True)
    return model


def forms(shape, masked: bool, threads: int):
    """name -> (session, feed) for every form; the forms are checked to agree first."""
    b, t, d, _ = shape
    rng = np.random.default_rng(0)
    qkv = {n: rng.standard_normal((b, t, d)).astype(np.float32) for n in "qkv"}
    keys = rng.random((b, 1, 1, t)) > 0.1  # a padding mask: about 10% of keys hidden
    additive = np.where(np.broadcast_to(keys, (b, 1, t, t)), 0.0, FLOAT_MIN).astype(np.float32)
    out = {}
    for form in ("composed17", "attention3d", "attention4d", "composed23"):
        feed = dict(qkv, mask=keys if form.startswith("composed") else additive) if masked else qkv
        out[form] = (session(_attention_model(form, shape, masked), threads=threads), feed)
    # every form agrees with the spec's attention within the suite's float32 tolerance
    spec = R.SelfAttention(R.ODEConfig(hidden_size=d, num_heads=shape[3]))
    heads = lambda dtype: [a.astype(dtype).reshape(b, t, shape[3], -1) for a in qkv.values()]  # noqa: E731
    run_spec = lambda dtype: spec.attn(*heads(dtype), keys if masked else np.ones((1, 1, t, t), bool)).reshape(b, t, d)  # noqa: E731
    want = run_spec(np.float64)
    limit = tolerance(relative_error(run_spec(np.float32), want), "float32")
    for form, (sess, feed) in out.items():
        err = relative_error(sess.run(None, feed)[0], want)
        if err > limit:
            raise AssertionError(f"{form}: relative error {err:.2e} against the spec; tolerance {limit:.2e}")
    return out


def blocks(shape, masked: bool, threads: int):
    b, t, d, h = shape
    cfg = R.ODEConfig(hidden_size=d, num_heads=h, ode_solver="rk4", ode_steps=4)
    params = R.init_params(cfg, seed=0)
    feed = {"x": np.random.default_rng(0).standard_normal((b, t, d)).astype(np.float32)}
    if masked:
        feed["padding_mask"] = np.ones((b, t), bool)
    return {f"opset{o}": (session(export_model(cfg, params, opset=o, padding_mask=masked), threads=threads), feed) for o in (17, 23)}


def interleaved(paths: dict, rounds: int, calls: int) -> dict:
    """name -> the median time (ms) of each round."""
    names, times = list(paths), {n: [] for n in paths}
    for r in range(rounds):
        for name in names if r % 2 == 0 else names[::-1]:
            sess, feed = paths[name]
            sess.run(None, feed)  # wake the threads
            ts = []
            for _ in range(calls):
                start = time.perf_counter()
                sess.run(None, feed)
                ts.append(time.perf_counter() - start)
            times[name].append(statistics.median(ts) * 1e3)
    return times


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=("forms", "block"))
    p.add_argument("--shape", choices=sorted(SHAPES), default="small")
    p.add_argument("--padding-mask", action="store_true")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--calls", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)  # errors only: not its note on the mask form's unused fill value
    build = forms if a.what == "forms" else blocks
    times = interleaved(build(SHAPES[a.shape], a.padding_mask, a.threads), a.rounds, a.calls)
    label = f"{a.shape}{' padding mask' if a.padding_mask else ''}"
    base = next(iter(times))
    for name, ts in times.items():
        ratios = [x / y for x, y in zip(times[base], ts)]
        print(f"{label}  {name:12s} median {statistics.median(ts):10.3f} ms   speed vs {base}: "
              f"{statistics.median(ratios):.3f}x ({min(ratios):.2f}..{max(ratios):.2f}) over {a.rounds} rounds")


if __name__ == "__main__":
    main()
