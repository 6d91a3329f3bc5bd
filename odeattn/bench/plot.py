"""The bench's PNGs: the scaling lines of the main table, and --memory's training memory."""

from __future__ import annotations

from odeattn.plotting import pyplot

from .scaling import shape_text


# (result key, x key, [(y key, scale, label)], title, y label) per panel
SCALING_PANELS = (
    ("time_vs_steps", "steps", [("median_s", 1e3, None)], "forward time vs steps, torch eager", "ms"),
    ("time_vs_seq", "seq", [("median_s", 1e3, None)], "forward time vs seq, torch eager", "ms"),
    ("export_vs_steps", "steps", [("inlined_bytes", 1e-3, "default (every step written out)"),
                                  ("bytes", 1e-3, "--functions (local functions)")], "ONNX file size vs steps", "kB"),
    ("jax_compile_vs_steps", "steps", [("compile_s", 1.0, None)], "JAX compile time vs steps", "s"),
)


def plot_scaling(result: dict, path) -> None:
    """Four panels of the scaling lines (bench_scaling's result): log2 x, y from zero (a flat line
    looks flat), each in its unit; the file size panel has both forms of the export, the default
    growing with the steps and the local functions' flat beside it."""
    plt = pyplot()
    sc = result["scaling"]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    fig.suptitle(f"scaling at the shape {shape_text(sc)}", fontsize=10)
    for ax, (key, xk, lines, title, unit) in zip(axes.flat, SCALING_PANELS):
        data = sc.get(key) or []
        for yk, scale, label in lines:
            if data and yk in data[0]:
                ax.plot([e[xk] for e in data], [e[yk] * scale for e in data], marker="o", label=label)
        if data:
            ax.set_xscale("log", base=2)
            ax.set_ylim(bottom=0, top=1.1 * max(e[yk] * scale for yk, scale, _ in lines if yk in data[0] for e in data))
        if any(label for _, _, label in lines) and data:
            ax.legend(fontsize=8, loc="lower right")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xk)
        ax.set_ylabel(unit)
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
