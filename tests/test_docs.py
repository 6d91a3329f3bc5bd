"""The README and the manual: every Python example runs as written, the manual builds with
`mkdocs build --strict`, its math is MathML with no TeX left, the performance page shows
docs/bench*.json's figures, and the README stays a front door."""

import html
import importlib.util
import json
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# A path of the repository named in a page: it starts with one of the top folders.
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:ode_ref|backends|conformance|export|odeattn|tests|benchmarks|docs|\.ci)/[\w./-]*)")
README_MAX_LINES = 250


def python_blocks(page: Path) -> list[str]:
    return PYTHON_BLOCK.findall(page.read_text())


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / np.abs(want).max())


def load_hooks():
    spec = importlib.util.spec_from_file_location("odeattn_docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- what each page's examples leave behind ------------------------------------------------------

def _golden_case(name):
    from odeattn.conformance.golden import GOLDEN_DIR, load_case, read_manifest

    return load_case(next(e for e in read_manifest(GOLDEN_DIR)["cases"] if e["name"] == name), GOLDEN_DIR)


def check_readme(ns, tmp_path):
    """The tour's four implementations agree; the adapter passes a case, skips BitLinear, and the
    README's command runs it from the adapter's folder."""
    from odeattn.conformance.running.compare import run_case
    import onnx

    assert ns["z1"].shape == ns["z_torch"].shape == ns["z_jax"].shape == ns["z_onnx"].shape == (2, 10, 64)
    assert relative_error(ns["z_torch"], ns["z1"]) < 1e-12
    assert relative_error(ns["z_jax"], ns["z1"]) < 1e-5 and relative_error(ns["z_onnx"], ns["z1"]) < 1e-5
    assert onnx.load(str(tmp_path / "block.onnx")).graph.node

    backend = ns["MyBackend"]()
    float_case = _golden_case("block_layer_norm_euler_encoder_float_nopad_s2_b1t9h4d16")
    bitnet_case = _golden_case("block_t1_h1_decoder_bitnet")
    assert run_case(backend, float_case, "float32").status == "passed"
    assert run_case(backend, bitnet_case, "float32").status == "skipped"

    adapter = next(b for b in python_blocks(README) if b.startswith("# mylib_odeattn.py"))
    (tmp_path / "mylib_odeattn.py").write_text(adapter)
    script = Path(sys.executable).with_name("odeattn")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "odeattn"]
    done = subprocess.run([*command, "conformance", "--backend", "mylib_odeattn:MyBackend", "-j", "1",
                           "-k", float_case.name, "-k", bitnet_case.name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^mylib\s+float32\s+1\s+0\s+1\s+0", done.stdout, re.M), done.stdout


def check_specification(ns, tmp_path):
    """The variant written on the page is the shipped LocalWindowAttention, in every port."""
    R = ns["R"]
    shipped = R.ode_block(ns["params"], ns["x"], ns["cfg"], ns["mask"], attention=R.LocalWindowAttention(ns["cfg"], window=2))
    assert (ns["z_local"] == shipped).all() and not (ns["z_local"] == ns["z1"]).all()
    assert ns["onnx_local"].graph.node and type(ns["z_torch_local"].ode_func).__name__ == "LocalWindow"


def check_conformance(ns, tmp_path):
    """The full adapter passes a block, a decode and a grad case in both precisions."""
    from odeattn.conformance.running.compare import run_case

    backend = ns["MyFullBackend"]()
    for name in ("block_rope_decoder_bitnet_pad", "decode_heun_dynamic_tanh_pad",
                 "grad_derf_rk38_encoder_bitnet_pad_s2_alibi_b3t6h3d12"):
        case = _golden_case(name)
        for dtype in backend.dtypes:
            result = run_case(backend, case, dtype)
            assert result.status == "passed", (name, dtype, result)


def check_export(ns, tmp_path):
    import onnx

    assert relative_error(ns["z"], ns["z_spec"]) < 1e-5 and relative_error(ns["z_ref"], ns["z_spec"]) < 1e-5
    assert (tmp_path / "block.onnx").stat().st_size > 0 and (tmp_path / "block.int8.onnx").stat().st_size > 0
    assert relative_error(ns["zl"], ns["zl_spec"]) < 1e-5 and ns["steps"] == 16  # the Loop form, at its last count
    # onnxruntime's own quantiser on the plain export: quantised, and within the derived bound
    assert "MatMulInteger" in {n.op_type for n in onnx.load(tmp_path / "block.q.onnx").graph.node}
    assert 1e-4 < ns["err_q"] <= ns["bound_q"]
    # the half export: within one bfloat16 ulp of the spec's policy (2 u max|z|, export.half's bound)
    assert ns["zb"].dtype.name == "bfloat16" and relative_error(ns["zb"].astype(np.float32), ns["zb_spec"]) <= 2 * 2.0**-8


def check_decoding(ns, tmp_path):
    assert ns["cache"].index == 8 and ns["z_next"].shape == (2, 1, 64)
    assert ns["ocache"].index == 8 and ns["jcache"].index == 8
    assert relative_error(ns["zj_next"], ns["z_next"]) < 1e-5 and relative_error(ns["zo_next"], ns["z_next"]) < 1e-5


def check_training(ns, tmp_path):
    import torch.distributed as dist

    assert not dist.is_initialized()  # the example leaves no process group behind
    assert set(ns["grads"]) == set(ns["params"])
    assert relative_error(ns["z_batch"], ns["z"]) < 1e-6 and relative_error(ns["z_heads"], ns["z"]) < 1e-6
    model = ns["ode_model"](ns["cfg"], layers=2, out_features=3)
    assert np.isfinite(ns["loss"]) and sum(ns["sizes"]) == sum(p.numel() for p in model.parameters())


def check_diagnose(ns, tmp_path):
    rk4 = next(r for r in ns["result"]["solvers"] if r["solver"] == "rk4")
    assert rk4["fewest_steps"] == 1 and ns["result"]["current_error"] < 1e-4
    assert ns["trained"]["parameters"] == 6305 and len(ns["trained"]["losses"]) == 20


def check_flax(ns, tmp_path):
    """The page's block, its cached decoding and its variant equal the spec's."""
    cfg, params, x, mask = ns["cfg"], ns["params"], ns["x"], ns["mask"]
    assert relative_error(ns["z"], ns["z_spec"]) < 1e-5 and int(ns["state"]["cache"]["cache_index"]) == 6
    from odeattn.conformance.cases import run_decode

    assert relative_error(ns["z_t"], run_decode(cfg, params, x, mask, 4)[:, 5:]) < 1e-5
    assert relative_error(ns["z_recent"], ns["z_recent_spec"]) < 1e-5 and relative_error(ns["z_recent"], ns["z"]) > 1e-3


def check_encoder(ns, tmp_path):
    assert ns["z"].shape == (2, 5, 16) and relative_error(ns["z_torch"], ns["z_spec"]) < 1e-5


def check_positions(ns, tmp_path):
    """The page's block decodes as it runs whole; BAM's and SSMax's parameters carry the seed's names."""
    assert sorted(k for k in ns["params"] if k.startswith("pos_encoder.")) == [
        "pos_encoder.ssmax.s", "pos_encoder.theta_alpha", "pos_encoder.theta_beta"]
    assert np.isfinite(ns["z"]).all() and ns["cache"].index == 5


def check_deployment(ns, tmp_path):
    """The jax.export program (run at a shape it was not traced at), OpenVINO's, IREE's, tract's (by
    tract, and by standalone.py loaded by its path) and the Core ATen program are the spec's block within the float32 tolerance of the spec's own error (tolerance.py)."""
    import ode_ref as R
    from odeattn.conformance.cases.tolerance import relative_error, tolerance

    cfg, x, mask = ns["cfg"], ns["x"].astype(np.float64), ns["mask"]
    params = R.init_params(cfg)
    want = R.ode_block(params, x, cfg, mask)
    allowed = tolerance(relative_error(R.ode_block(params, ns["x"], cfg, mask), want), "float32")
    core = ns["core"].module()(ns["torch"].as_tensor(ns["x"]), padding_mask=ns["torch"].as_tensor(ns["mask"]))
    for got in (ns["z"], ns["z_openvino"], ns["z_iree"], ns["z_tract"], ns["z_standalone"], core.detach().numpy()):
        assert relative_error(np.asarray(got), want) <= allowed


def check_generation(ns, tmp_path):
    """GenAI's rows are the spec's 8 greedy tokens each (the page's eos, 31, is not among them)."""
    assert ns["spec"].shape == (2, 8) and 31 not in ns["spec"]
    assert [list(map(int, row)) for row in ns["rows"]] == ns["spec"].tolist()
    assert (tmp_path / "lm" / "genai_config.json").exists()


def check_development(ns, tmp_path):
    """A kind written in one class runs: the spec passes it, a last step off by 1e-3 fails at step_3."""
    assert ns["passed"].status == "passed" and [q.quantity for q in ns["passed"].quantities] == ["step_1", "step_2", "step_3"]
    assert ns["failed"].status == "failed" and ns["failed"].message.startswith("diverges first at step_3: relative error 1.00e-03")


CHECKS = {"README.md": check_readme, "development.md": check_development, "generation.md": check_generation, "encoder.md": check_encoder, "flax.md": check_flax, "specification.md": check_specification, "conformance.md": check_conformance,
          "export.md": check_export, "decoding.md": check_decoding, "training.md": check_training,
          "diagnose.md": check_diagnose, "positions.md": check_positions,
          "deployment.md": check_deployment}
EXAMPLE_PAGES = [p for p in PAGES if python_blocks(p)]


def test_every_page_with_examples_has_its_checks():
    assert {p.name for p in EXAMPLE_PAGES} == set(CHECKS)


@pytest.mark.parametrize("page", EXAMPLE_PAGES, ids=lambda p: p.name)
def test_python_examples_run_as_written(page, tmp_path, monkeypatch, caplog):
    """A page's python blocks run in order in one namespace, in a temporary folder, and log no
    warning (onnxruntime's quantiser logged some 300 lines of them on the export page)."""
    for module in ("torch", "jax", "onnx", "onnxruntime", *(("flax",) if page.name == "flax.md" else ())):
        pytest.importorskip(module)
    monkeypatch.chdir(tmp_path)
    with socket.socket() as s:  # the DDP example's group of one meets on a free port
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("MASTER_PORT", str(s.getsockname()[1]))
    namespace = {"__name__": "__docs__"}
    try:
        for i, block in enumerate(python_blocks(page)):
            exec(compile(block, f"{page.name}, python block {i + 1}", "exec"), namespace)
    finally:
        if "torch.distributed" in sys.modules and sys.modules["torch.distributed"].is_initialized():
            sys.modules["torch.distributed"].destroy_process_group()
            raise AssertionError(f"{page.name}: an example left a process group initialised")
    CHECKS[page.name](namespace, tmp_path)
    logged = [r.getMessage()[:200] for r in caplog.records if r.levelno >= logging.WARNING]
    assert not logged, logged


# -- the shell blocks --------------------------------------------------------------------------

SHELL_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
ACTIVATE = ". .venv/bin/activate"
# docs/development.md's rule: a shell line is run as written, unless it starts with one of these,
# each with why not. Such a line is checked instead: an odeattn command's arguments parse, and
# the shell finds odeattn where the line stands (the block has put the venv on the PATH).
NOT_RUN = {
    "python3 -m venv .venv && .venv/bin/pip install": "installs (the network; CI's .ci/run installs the same way)",
    "npm ci --prefix conformance/js": "installs the JavaScript workers (the network)",
    "odeattn conformance --backend spec --backend torch --backend onnxruntime": "the quick first look: a minute, "
    "measured; the same backends run in tests/conformance",
    "odeattn conformance generate": "rewrites the packaged golden set in place (tests/conformance regenerates it "
    "into a temporary folder)",
    "odeattn bench": "the performance page's runs, minutes to half an hour (tests/odeattn/commands/test_bench.py "
    "runs the bench at small shapes)",
    "python benchmarks/": "a benchmark script's run, minutes (the files it names are checked to exist)",
    "odeattn export --target aoti": "a C++ build of tens of seconds (tests/export/test_compiled.py runs the command)",
    "odeattn export --target executorch": "a lowering of a minute (tests/export/test_compiled.py runs the command)",
    "odeattn export --target litert": "needs the litert extra, outside [all], which the quick start's test command "
    "does not install (tests/export/test_litert.py runs the command)",
}


def shell_lines(block: str) -> list[str]:
    """A block's command lines, a backslash-continued line joined, without blank lines."""
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def not_run(line: str):
    return next((start for start in NOT_RUN if line.startswith(start)), None)


SHELL_PAGES = [p for p in PAGES if SHELL_BLOCK.findall(p.read_text())]


def test_every_line_not_run_is_still_in_the_pages():
    lines = [line for p in SHELL_PAGES for block in SHELL_BLOCK.findall(p.read_text()) for line in shell_lines(block)]
    assert all(any(line.startswith(start) for line in lines) for start in NOT_RUN)


@pytest.mark.parametrize("page", SHELL_PAGES, ids=lambda p: p.name)
def test_shell_examples_run_as_written(page, tmp_path):
    """A page's bash blocks, each in a fresh shell (no venv on the PATH) in a temporary folder
    that holds the venv as a clone holds it after the quick start (.venv), and the README's
    adapter file; every line run as written but those of NOT_RUN, which are checked."""
    from odeattn.cli import build_parser

    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip("needs a virtual environment, as the quick start makes (.venv/bin/activate)")
    for module in ("torch", "onnx", "onnxruntime", "matplotlib"):
        pytest.importorskip(module)
    (tmp_path / ".venv").symlink_to(venv)
    adapter = next(b for b in python_blocks(README) if b.startswith("# mylib_odeattn.py"))
    (tmp_path / "mylib_odeattn.py").write_text(adapter)
    path = os.pathsep.join(d for d in os.environ.get("PATH", os.defpath).split(os.pathsep)
                           if Path(d).resolve() != (venv / "bin").resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")} | {"PATH": path}
    for i, block in enumerate(SHELL_BLOCK.findall(page.read_text())):
        script = []
        for line in shell_lines(block):
            start = not_run(line)
            if start is None:
                script.append(line)
            elif line.startswith("odeattn "):
                build_parser().parse_args(shlex.split(line, comments=True)[1:])  # SystemExit(2) if not
                script.append("command -v odeattn > /dev/null")
        done = subprocess.run(["bash", "--noprofile", "--norc", "-e", "-c", "\n".join(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{page.name}, bash block {i + 1}:\n{done.stdout}\n{done.stderr}"


def test_the_quick_first_look_compiles_nothing_and_gives_its_rows(tmp_path, capsys):
    """The README's quick first look, on one case: the spec, torch and ONNX Runtime rows in float32
    and float64, and no JAX program (nothing for a cold cache to compile)."""
    from odeattn.cli import main

    for module in ("torch", "onnxruntime"):
        pytest.importorskip(module)
    (line,) = [line for b in SHELL_BLOCK.findall(README.read_text()) for line in shell_lines(b)
               if line.startswith("odeattn conformance --backend spec ")]
    argv = [*shlex.split(line)[1:], "-k", "derf_euler_encoder_float_nopad_s1_b2t5h2d8$", "--json", str(tmp_path / "r.json")]
    assert main(argv) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    rows = [(r["backend"], r["dtype"], r["passed"]) for r in report["summary"]]
    assert rows == [("spec", "float64", 1), ("torch", "float32", 1), ("torch", "float64", 1), ("onnxruntime", "float32", 1)]
    assert sum(b["programs"] for b in report["profile"]["backends"].values()) == 0
    assert "JAX compiling" not in capsys.readouterr().err


def test_readme_is_at_most_250_lines():
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_name_only_files_that_exist(page):
    missing = sorted({p for p in REPO_PATH.findall(page.read_text()) if not (ROOT / p.rstrip(".")).exists()})
    assert not missing, f"{page.name} names {missing}"


# -- the manual's build and its generated performance page ---------------------------------------

def bench_figures(name: str) -> list[str]:
    """Figures of docs/<name> that its rendered tables must show, as they are printed."""
    result = json.loads((DOCS / name).read_text())
    if "paths" in result:
        figures = [f"{r['median_s'] * 1e3:.2f}" for r in result["paths"] if "median_s" in r]
        figures += [t["value"] for t in result["targets"]]
        figures += [f"{m['peak_rss_bytes'] / 1e6:.1f}" for m in result["long_context"]["rows"].values() if "peak_rss_bytes" in m]
        return figures
    if "compile" in result:
        return [f"{r['first_minus_warm_s']:.2f}" for r in result["compile"]["rows"]] + [t["value"] for t in result["targets"]]
    return [f"{r['peak_bytes'] / 1e6:.3f}" for r in result["memory"]] + [f"{r['peak_ratio']:.2f}x" for r in result["ratios"]]


BENCH_FILES = ("bench.json", "bench_amd_avx512.json", "bench_amd_avx2.json", "bench_memory.json", "bench_compile.json")


@pytest.mark.parametrize("name", BENCH_FILES)
def test_performance_tables_are_markdown_tables_showing_the_json_figures(name):
    """Real tables (the theme fits them to the column or scrolls them), not fixed-width text."""
    pytest.importorskip("mkdocs")
    text = load_hooks().render(name, json.loads((DOCS / name).read_text()))
    missing = [f for f in bench_figures(name) if f not in text]
    assert not missing and "```" not in text and "| --- |" in text


# TeX left in a page's text, code, preformatted blocks and scripts aside: a delimiter, any command
# (also one latex2mathml passed through into a <math> element), or arithmatex's mark of math
# that was not converted
CODE = re.compile(r"<(pre|code|script)\b.*?</\1>", re.S)
RAW_TEX = re.compile(r"\\[()[\]a-zA-Z]|\$\$|class=\"arithmatex\"|\$[^$\s<][^$<]*\$")


def raw_tex(page: str) -> list[str]:
    return RAW_TEX.findall(CODE.sub("", page))


def test_mkdocs_build_strict_succeeds(tmp_path):
    for module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python"):
        pytest.importorskip(module)
    site = tmp_path / "site"
    # no -q: with it, strict mode does not count the warnings and exits 0; any WARNING line fails too
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    log = done.stdout + done.stderr
    assert done.returncode == 0 and not re.search(r"^WARNING\b", log, re.M), log
    page = html.unescape((site / "performance" / "index.html").read_text())
    missing = [f for name in BENCH_FILES for f in bench_figures(name) if f not in page]
    assert not missing
    raw = {str(p.relative_to(site)): found for p in site.rglob("*.html") if (found := raw_tex(p.read_text()))}
    assert not raw, raw
    assert (site / "specification" / "index.html").read_text().count("<math") >= 20  # the formulas are math
    api = (site / "api" / "index.html").read_text()
    assert "ODEAttentionBlock" in api and "export_model" in api and "run_suite" in api
    shutil.rmtree(site)
