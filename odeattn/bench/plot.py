"""The bench's PNGs: the scaling lines of the main table, and --memory's training memory."""

from __future__ import annotations

from odeattn.plotting import pyplot

from .scaling import shape_text


def plot_scaling(result: dict, path) -> None:
    """Four panels of the scaling lines (bench_scaling's result): log2 x, y from zero."""
    plt = pyplot()
    sc = result["scaling"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    fig.suptitle(f"scaling at the shape {shape_text(sc)}", fontsize=10)
    panels = [
        (axes[0, 0], "time_vs_steps", "steps", "median_s", "forward time (s) vs steps, torch eager"),
        (axes[0, 1], "time_vs_seq", "seq", "median_s", "forward time (s) vs seq, torch eager"),
        (axes[1, 0], "export_vs_steps", "steps", "bytes", "ONNX file size (bytes) vs steps"),
        (axes[1, 1], "jax_compile_vs_steps", "steps", "compile_s", "JAX compile time (s) vs steps"),
    ]
    for ax, key, xk, yk, title in panels:
        data = sc.get(key) or []
        if data:
            ax.plot([e[xk] for e in data], [e[yk] for e in data], marker="o")
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0)  # from zero: a flat line must look flat
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xk)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_memory(result: dict, path) -> None:
    """Two panels, log-log: peak activation memory vs steps, and time vs steps; both modes."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for runtime in dict.fromkeys(r["runtime"] for r in result["memory"]):
        for checkpoint, style in ((False, "o-"), (True, "s--")):
            mine = [r for r in result["memory"] if r["runtime"] == runtime and r["checkpoint"] == checkpoint]
            label = f"{runtime}, {'checkpoint' if checkpoint else 'no checkpoint'}"
            steps = [r["steps"] for r in mine]
            axes[0].plot(steps, [r["peak_bytes"] / 1e6 for r in mine], style, label=label)
            axes[1].plot(steps, [r["median_s"] * 1e3 for r in mine], style, label=label)
    for ax, title in ((axes[0], "peak activation memory (MB) vs steps"), (axes[1], "forward+backward time (ms) vs steps")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ode_steps")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
