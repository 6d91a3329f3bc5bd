"""What this machine's libraries allow: the float32 matmul peak, and the block's products alone.

Timed in the same rounds as the paths: the peak (the best matmul GFLOP/s of a round) is what
`% peak` divides by, and the products alone (product_chain: the matrix products of a forward and
nothing else) bound what a path could reach whose other work were free. The ONNX Runtime graphs
here are built and run through one function, _ort_session.
"""

from __future__ import annotations

import operator
from typing import Callable

import numpy as np


PEAK_LIBS = ("torch.mm", "onednn", "numpy", "ort MatMul", "xla dot")  # every float32 GEMM the limit takes


def _onednn_linear(torch, w_t):
    """A float32 x -> x @ w_t through oneDNN, w_t packed once (the torch port's inference GEMM on
    AMD CPUs: backends/torch/gemm.py); None where this torch has no oneDNN."""
    from odeattn.backends.torch.gemm import onednn_linear, onednn_usable, pack

    if not onednn_usable():
        return None
    packed = pack(w_t.T.contiguous())
    return lambda x: onednn_linear(x, packed)


def peak_kernels(sizes, threads: int, log) -> list[tuple[str, tuple, Callable]]:
    """[(library, (m, k, n), zero-argument float32 matmul)] for every library installed."""
    rng = np.random.default_rng(1)
    out = []
    for m, k, n in sizes:
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        out.append(("numpy", (m, k, n), lambda a=a, b=b: a @ b))
        try:
            import torch

            torch.set_num_threads(threads)
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            out.append(("torch.mm", (m, k, n), lambda ta=ta, tb=tb: torch.mm(ta, tb)))
            onednn = _onednn_linear(torch, tb)
            if onednn is None:
                log("  peak: oneDNN skipped (absent or disabled in this torch)")
            else:
                out.append(("onednn", (m, k, n), lambda ta=ta, onednn=onednn: onednn(ta)))
        except ImportError as err:
            log(f"  peak: torch.mm skipped ({err})")
        try:
            from onnx import TensorProto, helper

            run = _ort_session([helper.make_node("MatMul", ["a", "b"], ["c"])], {"a": a},
                               {"c": (TensorProto.FLOAT, (m, n))}, {"b": b}, threads)
            out.append(("ort MatMul", (m, k, n), run))
        except ImportError as err:
            log(f"  peak: ONNX Runtime MatMul skipped ({err})")
        try:
            import jax
            import jax.numpy as jnp

            dot = jax.jit(jnp.dot)
            ja, jb = jnp.asarray(a), jnp.asarray(b)
            dot(ja, jb).block_until_ready()  # compiles
            out.append(("xla dot", (m, k, n), lambda ja=ja, jb=jb, dot=dot: dot(ja, jb).block_until_ready()))
        except ImportError as err:
            log(f"  peak: XLA dot skipped ({err})")
    return out


PRODUCT_LIBS = ("torch", "onednn", "numpy", "ort", "xla")


def product_chain(h, q, a, w_qkv, kt, v, w_out, evaluations: int, project=operator.matmul):
    """The block's float32 matrix products over a forward, and nothing else: per evaluation the qkv
    projection h @ w_qkv (B T, D) x (D, 3 D), the output projection h @ w_out (B T, D) x (D, D),
    the scores q @ kt (B H, T, d_h) x (B H, d_h, T) and the weighted values a @ v (B H, T, T) x
    (B H, T, d_h): flops()'s count. Each evaluation's operands are the previous one's products
    (h from h @ w_out, q from a @ v, a from q @ kt; the qkv projections summed), so no runtime can
    merge or drop a repeated product, and only the last ones are returned. The scores are written
    out, as the plain block and the opset 17 export do (JAX too, below 4 MiB of them). The same code for NumPy, torch and
    traced JAX arrays (`@` and `+`); project(h, w) computes the two projections (oneDNN's: w packed)."""
    total = None
    for _ in range(evaluations):
        qkv = project(h, w_qkv)
        total = qkv if total is None else total + qkv
        q, a, h = a @ v, q @ kt, project(h, w_out)
    return h, q, a, total


CHAIN_ARGS = ("h", "q", "a", "w_qkv", "kt", "v", "w_out")


def product_operands(shape) -> dict:
    """product_chain's float32 operands at shape, scaled so that the chained products keep unit
    variance (w_out by 1 / sqrt(D), kt by 1 / sqrt(d_h), v by 1 / sqrt(T))."""
    batch, seq, d_model, heads = shape
    bt, bh, dh = batch * seq, batch * heads, d_model // heads
    rng = np.random.default_rng(2)

    def draw(*s, scale=1.0):
        return rng.standard_normal(s, dtype=np.float32) * np.float32(scale)

    return {"h": draw(bt, d_model), "q": draw(bh, seq, dh), "a": draw(bh, seq, seq), "w_qkv": draw(d_model, 3 * d_model),
            "kt": draw(bh, dh, seq, scale=dh**-0.5), "v": draw(bh, seq, dh, scale=seq**-0.5),
            "w_out": draw(d_model, d_model, scale=d_model**-0.5)}


def _ort_session(nodes, inputs: dict, outputs: dict, initializers: dict, threads: int):
    """A zero-argument run of a one-graph ONNX model over `inputs` (name -> array); outputs maps
    names to (element type, shape)."""
    from onnx import helper, numpy_helper

    from odeattn.export.runtime import session

    def info(name, elem, shape):
        return helper.make_tensor_value_info(name, elem, list(shape))

    graph = helper.make_graph(nodes, "products", [info(k, helper.np_dtype_to_tensor_dtype(x.dtype), x.shape)
                                                  for k, x in inputs.items()],
                              [info(k, *t) for k, t in outputs.items()],
                              [numpy_helper.from_array(x, k) for k, x in initializers.items()])
    sess = session(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), threads=threads)
    return lambda: sess.run(None, inputs)


def _running_sum(nodes: list, total: str | None, term: str) -> str:
    """The name of total + term, appending its Add node to nodes; term itself when total is None."""
    if total is None:
        return term
    from onnx import helper

    nodes.append(helper.make_node("Add", [total, term], [f"{term}_sum"]))
    return f"{term}_sum"


def _ort_product_chain(ops: dict, evaluations: int, threads: int):
    """product_chain as an ONNX graph (inputs h, q, a; the rest initializers)."""
    from onnx import TensorProto, helper

    nodes, names = [], {"h": "h", "q": "q", "a": "a"}
    for e in range(evaluations):
        nodes.append(helper.make_node("MatMul", [names["h"], "w_qkv"], [f"qkv{e}"]))
        names["total"] = _running_sum(nodes, names.get("total"), f"qkv{e}")
        nodes += [helper.make_node("MatMul", [names["a"], "v"], [f"q{e + 1}"]),
                  helper.make_node("MatMul", [names["q"], "kt"], [f"a{e + 1}"]),
                  helper.make_node("MatMul", [names["h"], "w_out"], [f"h{e + 1}"])]
        names.update(q=f"q{e + 1}", a=f"a{e + 1}", h=f"h{e + 1}")
    shapes = {"h": ops["h"].shape, "q": ops["q"].shape, "a": ops["a"].shape,
              "total": (ops["h"].shape[0], ops["w_qkv"].shape[1])}  # product_chain's results
    outputs = {names[k]: (TensorProto.FLOAT, s) for k, s in shapes.items()}
    return _ort_session(nodes, {k: ops[k] for k in ("h", "q", "a")}, outputs,
                        {k: ops[k] for k in CHAIN_ARGS if k not in ("h", "q", "a")}, threads)


def ort_projections(shape, evaluations: int, threads: int, *, integer: bool):
    """A zero-argument run of ONNX Runtime's two projections of a forward and nothing else: per
    evaluation h @ W_qkv and h @ W_out, each evaluation's h an input of its own (the same array, so
    no product is merged), their results summed. Float: float32 MatMul, as the float BitLinear
    export runs them; integer: MatMulInteger of uint8 levels (zero point 128) by int8 ternary
    weights into int32, as export_model(..., bitlinear="integer") does, without its quantisation
    and scale (elementwise passes both forms have in some form)."""
    from onnx import TensorProto, helper

    batch, seq, d_model, _ = shape
    rng = np.random.default_rng(3)
    if integer:
        h = rng.integers(0, 256, (batch * seq, d_model), dtype=np.uint8)
        w = {k: rng.integers(-1, 2, (d_model, n * d_model), dtype=np.int8) for k, n in (("w_qkv", 3), ("w_out", 1))}
        initializers, elem = {**w, "zero": np.array(128, np.uint8)}, TensorProto.INT32
    else:
        h = rng.standard_normal((batch * seq, d_model), dtype=np.float32)
        initializers = {k: np.sign(rng.standard_normal((d_model, n * d_model), dtype=np.float32))
                        for k, n in (("w_qkv", 3), ("w_out", 1))}
        elem = TensorProto.FLOAT
    nodes, total = [], {}
    for e in range(evaluations):
        for w in ("w_qkv", "w_out"):
            args = [f"h{e}", w, "zero"] if integer else [f"h{e}", w]
            nodes.append(helper.make_node("MatMulInteger" if integer else "MatMul", args, [f"{w}{e}"]))
            total[w] = _running_sum(nodes, total.get(w), f"{w}{e}")
    outputs = {total["w_qkv"]: (elem, (batch * seq, 3 * d_model)), total["w_out"]: (elem, (batch * seq, d_model))}
    return _ort_session(nodes, {f"h{e}": h for e in range(evaluations)}, outputs, initializers, threads)


def product_kernels(shape, evaluations: int, threads: int, log) -> list[tuple[str, Callable]]:
    """[(library, zero-argument fn)]: product_chain for a forward of `evaluations` evaluations at
    shape, in each library installed. Timed like a path, it is how fast a path could run whose
    products ran at that library's speed, written out, and whose norms, softmax, masks and
    Runge-Kutta sums cost nothing: for a path that writes all its scores out (torch-plain,
    ort-opset17) a bound. A fused attention kernel that never writes the scores (SDPA's, in
    torch-eager and torch-compile) can beat it, and so can jax-jit's tiles of heads."""
    ops = product_operands(shape)
    args = [ops[k] for k in CHAIN_ARGS]
    out = [("numpy", lambda: product_chain(*args, evaluations))]
    try:
        import torch

        torch.set_num_threads(threads)
        targs = [torch.from_numpy(x) for x in args]
        out.append(("torch", lambda: product_chain(*targs, evaluations)))
        w_qkv, w_out = (_onednn_linear(torch, targs[CHAIN_ARGS.index(k)]) for k in ("w_qkv", "w_out"))
        if w_qkv is None:
            log("  products: oneDNN skipped (absent or disabled in this torch)")
        else:  # the projections through oneDNN, the batched products through torch, as the port runs them
            packed = [w_qkv if k == "w_qkv" else w_out if k == "w_out" else t for k, t in zip(CHAIN_ARGS, targs)]
            out.append(("onednn", lambda: product_chain(*packed, evaluations, project=lambda h, w: w(h))))
    except ImportError as err:
        log(f"  products: torch skipped ({err})")
    try:
        out.append(("ort", _ort_product_chain(ops, evaluations, threads)))
    except ImportError as err:
        log(f"  products: ONNX Runtime skipped ({err})")
    try:
        import jax
        import jax.numpy as jnp

        fn = jax.jit(product_chain, static_argnums=(7,))
        jargs = [jnp.asarray(x) for x in args]
        jax.block_until_ready(fn(*jargs, evaluations))  # compiles
        out.append(("xla", lambda: jax.block_until_ready(fn(*jargs, evaluations))))
    except ImportError as err:
        log(f"  products: XLA skipped ({err})")
    return out
