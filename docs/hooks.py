"""MkDocs hooks of the manual (mkdocs.yml's `hooks:`).

- The API reference reads the sources in their installed layout. pyproject.toml's package-dir
  installs backends/, conformance/ and export/ as odeattn.backends, odeattn.conformance and
  odeattn.export, which mkdocstrings cannot follow from the checkout, so on_config copies the
  sources into a temporary tree of that layout and points mkdocstrings' Python handler at it.
- The performance page is generated: a line `<!-- bench: NAME.json -->` becomes the tables of
  docs/NAME.json, as Markdown tables built from the JSON.
- The math is MathML, made at build time: pymdownx.arithmatex (generic mode) marks each `$...$`
  and `$$...$$` outside code, and on_page_content converts its TeX with latex2mathml, so the site
  holds no TeX and no script for it, and browsers render it natively, offline
  (docs/development.md, "The manual").
"""

from __future__ import annotations

import html
import json
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from mkdocs.plugins import event_priority

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PLACEHOLDER = re.compile(r"^<!-- bench: ([\w.-]+\.json) -->$", re.M)
# What pymdownx.arithmatex's generic mode writes: its TeX, HTML-escaped, between \( \) or \[ \]
ARITHMATEX = re.compile(r'<(span|div) class="arithmatex">\s*\\[(\[](.*?)\\[)\]]\s*</\1>', re.S)
# The installed layout when pyproject.toml cannot be read (Python 3.10 has no tomllib).
PACKAGE_DIRS = {"ode_ref": "ode_ref", "odeattn": "odeattn", "odeattn.backends": "backends",
                "odeattn.conformance": "conformance", "odeattn.export": "export"}

_source_tree: list[str] = []


def package_dirs(root: Path = ROOT) -> dict:
    """Import name -> folder of the checkout, as pyproject.toml installs them."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return dict(PACKAGE_DIRS)
    setuptools = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapped = setuptools.get("package-dir", {})
    top = {p for p in setuptools["packages"] if "." not in p}
    dirs = {name: name for name in sorted(top)}
    dirs.update(mapped)
    return dirs


def build_source_tree(target: Path, root: Path = ROOT) -> Path:
    """Copy every package's .py files into target in the installed layout; returns target."""
    for name, folder in sorted(package_dirs(root).items(), key=lambda item: item[0].count(".")):
        shutil.copytree(root / folder, target.joinpath(*name.split(".")), dirs_exist_ok=True, ignore=_not_python)
    return target


def _not_python(folder, names) -> list[str]:
    return [n for n in names if n == "__pycache__" or not (n.endswith(".py") or (Path(folder) / n).is_dir())]


@event_priority(100)  # before mkdocstrings' own on_config, which creates the Python handler
def on_config(config):
    tree = tempfile.mkdtemp(prefix="odeattn-api-")
    _source_tree.append(tree)
    build_source_tree(Path(tree))
    handlers = config.plugins["mkdocstrings"].config.handlers
    handlers.setdefault("python", {})["paths"] = [tree]
    return config


def on_shutdown():
    while _source_tree:
        shutil.rmtree(_source_tree.pop(), ignore_errors=True)


def on_page_markdown(markdown, page, config, files):
    return PLACEHOLDER.sub(lambda m: render(m.group(1), json.loads((DOCS / m.group(1)).read_text())), markdown)


def on_page_content(html_text, page, config, files):
    return mathml(html_text)


def mathml(html_text: str) -> str:
    """Every arithmatex span (inline) and div (display) of a page as a MathML <math> element."""
    from latex2mathml.converter import convert

    def one(m):
        display = "block" if m.group(1) == "div" else "inline"
        return convert(html.unescape(m.group(2)), display=display)

    return ARITHMATEX.sub(one, html_text)


# -- the bench's tables ------------------------------------------------------------------------

def render(name: str, result: dict) -> str:
    """The Markdown tables for docs/<name>: a main bench run, a --memory run or a --compile run.
    Real tables, not the bench's fixed-width text, so the theme fits them to the column or
    scrolls them."""
    kind = "tables" if "paths" in result else "compile" if "compile" in result else "memory"
    return {"tables": markdown_bench, "compile": markdown_compile, "memory": markdown_memory}[kind](result)


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header, rows) -> list[str]:
    return [_row(header), _row(["---"] * len(header)), *(_row(r) for r in rows), ""]


def _mb(value) -> str:
    return f"{value / 1e6:.1f}" if value is not None else "-"


def markdown_bench(result: dict) -> str:
    """The main table, the long-context table, the scaling lines and the targets of a bench run."""
    from odeattn.bench.tables import machine_text

    out = [(f"Measured on {machine_text(result['machine'])}. " if result.get("machine") else "")
           + f"Threads {result['threads']}; {result['solver']} × {result['steps']} steps, float32 unless f64; "
           f"{result['repeats']} interleaved rounds, bursts of about {result['burst_s']} s; ratios paired per round.", ""]
    for peak in result.get("peaks", []):
        sizes = list(dict.fromkeys(k["size"] for k in peak["kernels"]))
        got = {(k["library"], k["size"]): k["gflops"] for k in peak["kernels"]}
        libs = list(dict.fromkeys(k["library"] for k in peak["kernels"]))
        lim = peak.get("limit")
        out.append(f"Float32 matmul GFLOP/s, shape {peak['shape']} (median over rounds; m × k × n); "
                   f"the peak per round: median {statistics.median(peak['round_gflops']):.1f} GFLOP/s"
                   + (f", reached by {lim['library']} in {lim['rounds']} of {lim['of']} rounds." if lim else "."))
        out.append("")
        out += _table(["library", *sizes], [[lib, *(f"{got[lib, s]:.1f}" for s in sizes)] for lib in libs])
    rows = []
    for r in result["paths"]:
        if "skipped" in r:
            rows.append([r["shape"], r["path"], "skipped: " + r["skipped"], *["-"] * 10])
            continue
        mem = r.get("memory") or {}
        vs = r.get("vs_plain")
        rows.append([r["shape"], r["path"], f"{r['median_s'] * 1e3:.2f}", f"{r['min_s'] * 1e3:.2f}",
                     f"{r['setup_s'] + r['first_call_s']:.2f}", f"{r['gflops']:.1f}",
                     *(f"{100 * r[k]:.1f}%" if r.get(k) is not None else "-" for k in ("peak_fraction", "products_fraction")),
                     f"{vs['median']:.2f}x ({vs['min']:.2f}..{vs['max']:.2f})" if vs else "-",
                     _mb(mem.get("peak_rss_bytes")), _mb(mem.get("live_tensor_bytes")),
                     f"{r['file_bytes'] / 1e3:.1f}" if r.get("file_bytes") else "-", f"{r['max_rel_error']:.2e}"])
    out += _table(["shape", "path", "median ms", "min ms", "setup+first s", "GFLOP/s", "% peak", "% products", "vs plain (min..max)",
                   "peak MB", "live MB", "file kB", "max err"], rows)
    long = result.get("long_context")
    if long:
        out += ["Long context, B{} T{} D{} H{}, one fresh process per path:".format(*long["shape"]), ""]
        out += _table(["path", "peak MB", "live MB", "setup+first s", "forward s"], [
            [name, "skipped: " + m["skipped"], "-", "-", "-"] if "skipped" in m else
            [name, _mb(m.get("peak_rss_bytes")), _mb(m.get("live_tensor_bytes")),
             f"{m['setup_and_first_call_s']:.2f}", f"{m['call_s']:.2f}" if m.get("call_s") is not None else "-"]
            for name, m in long["rows"].items()])
    sc = result.get("scaling") or {}
    lines = []
    if sc.get("time_vs_steps"):
        lines.append("time vs steps (torch eager, small shape): " + ", ".join(
            f"{e['steps']}: {e['median_s'] * 1e3:.1f} ms" for e in sc["time_vs_steps"]))
    if sc.get("time_vs_seq"):
        lines.append("time vs seq (torch eager, 4 rk4 steps): " + ", ".join(
            f"{e['seq']}: {e['median_s'] * 1e3:.1f} ms" for e in sc["time_vs_seq"]))
    if sc.get("export_vs_steps"):
        lines.append("ONNX export vs steps (--functions file): " + ", ".join(
            f"{e['steps']}: {e['export_s'] * 1e3:.0f} ms / {e['bytes'] / 1e3:.1f} kB" for e in sc["export_vs_steps"]))
        lines.append("ONNX default (inlined) file vs steps: " + ", ".join(
            f"{e['steps']}: {e['inlined_bytes'] / 1e3:.1f} kB" for e in sc["export_vs_steps"]))
    if sc.get("jax_compile_vs_steps"):
        lines.append("JAX compile vs steps: " + ", ".join(
            f"{e['steps']}: {e['compile_s'] * 1e3:.0f} ms" for e in sc["jax_compile_vs_steps"]))
    out += [f"- {line}" for line in lines] + ([""] if lines else [])
    met = {True: "met", False: "NOT MET", None: "not measured"}
    out += _table(["target", "this run", "result", "beside it"],
                  [[t["target"], t["value"], met[t["met"]], t["note"] or ""] for t in result.get("targets", [])])
    return "\n".join(out)


def markdown_compile(result: dict) -> str:
    """The JAX first call against its warm call per config, the paired ratios and the targets."""
    c = result["compile"]
    out = ["JAX first call − warm call, fresh process, no persistent cache: B{} T{} D{} H{}, float32, {} rounds.".format(
        *c["shape"], c["repeats"]), ""]
    rows = []
    for r in c["rows"]:
        got = [v for v in r["round_first_minus_warm_s"] if v is not None]
        rows.append([r["config"], f"{r['first_minus_warm_s']:.2f}", f"{min(got):.2f}..{max(got):.2f}",
                     f"{r['first_minus_warm_cpu_s']:.2f}", f"{r['warm_s'] * 1e3:.1f}"] if got else [r["config"], "failed", "-", "-", "-"])
    out += _table(["config", "first − warm s", "min..max", "CPU s", "warm ms"], rows)
    out += [f"- {name}: {r['median']:.2f}x (min {r['min']:.2f}, max {r['max']:.2f})" for name, r in c["ratios"].items()] + [""]
    met = {True: "met", False: "NOT MET", None: "not measured"}
    out += _table(["target", "this run", "result"], [[t["target"], t["value"], met[t["met"]]] for t in result["targets"]])
    return "\n".join(out)


def markdown_memory(result: dict) -> str:
    """The peak and time of forward+backward against the steps, with and without checkpointing."""
    b, t, d, h = result["shape"]
    out = [f"Forward+backward of sum(z(1)), batch {b}, seq {t}, d_model {d}, {h} heads, {result['solver']}, "
           f"float32, threads {result['threads']}.", ""]
    by = {(r["runtime"], r["steps"], r["checkpoint"]): r for r in result["memory"]}
    rows = []
    for (runtime, steps, checkpoint), plain in by.items():
        if checkpoint:
            continue
        ck = by[runtime, steps, True]
        rows.append([runtime, steps, f"{plain['peak_bytes'] / 1e6:.3f}", f"{ck['peak_bytes'] / 1e6:.3f}",
                     f"{plain['median_s'] * 1e3:.2f}", f"{ck['median_s'] * 1e3:.2f}",
                     f"{ck['median_s'] / plain['median_s']:.2f}x"])
    out += _table(["runtime", "steps", "peak MB", "ckpt MB", "ms", "ckpt ms", "time x"], rows)
    target = result.get("target_ratio")
    for r in result.get("ratios", []):
        verdict = "" if r["meets_target"] is None else f"; target ≤ {target}x: {'met' if r['meets_target'] else 'MISSED'}"
        out.append(f"- {r['runtime']} {'with' if r['checkpoint'] else 'without'} checkpointing: peak at "
                   f"{r['to_steps']} steps / {r['from_steps']} = {r['peak_ratio']:.2f}x{verdict}")
    return "\n".join(out)
