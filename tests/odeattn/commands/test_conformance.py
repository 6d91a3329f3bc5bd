"""`odeattn conformance`: the main job, and user errors refused in one line each, exit 2, before
any case runs (and `generate`'s and `mutants`' own)."""

import json
import shutil

import pytest

from odeattn.conformance import golden
from odeattn.cli import main


@pytest.mark.parametrize("argv, message", [
    pytest.param(["-k", "block_(derf"], "-k: invalid regular expression 'block_(derf'", id="include-not-a-regex"),
    pytest.param(["--exclude", "["], "--exclude: invalid regular expression '['", id="exclude-not-a-regex"),
    pytest.param(["--xfail", "spec/("], "--xfail: invalid regular expression 'spec/('", id="xfail-not-a-regex"),
    pytest.param(["--backend", "odeattn.conformance.adapters:Missing"],
                 "--backend odeattn.conformance.adapters:Missing: cannot be loaded (AttributeError", id="backend-object-missing"),
    pytest.param(["--backend", "no_such_module_anywhere:Backend"],
                 "--backend no_such_module_anywhere:Backend: cannot be loaded (ModuleNotFoundError", id="backend-module-missing"),
    pytest.param(["--backend", "tensorflow"], "--backend: expected one of spec, torch, torch-onednn, jax", id="backend-unknown-name"),
    pytest.param(["--backend", "onnxruntime-int8"], "--backend onnxruntime-int8: not a conformance backend: int8 dynamic "
                                                    "quantisation (odeattn export --quantize int8) is lossy",
                 id="backend-int8-is-not-one"),
    pytest.param(["--json", "{tmp}/missing/r.json"], "--json: the folder '{tmp}/missing' does not exist",
                 id="json-in-a-missing-folder"),
    pytest.param(["--junit", "{tmp}"], "--junit: expected a file path; got the folder '{tmp}'", id="junit-is-a-folder"),
    pytest.param(["--junit", "/proc/r.xml"], "--junit: '/proc/r.xml' is not writable", id="junit-not-writable"),
    pytest.param(["-k", "no-such-case"], "-k/--exclude: no case matches the patterns", id="no-case-selected"),
    pytest.param(["--expect-digest", "0" * 64], "--expect-digest: expected " + "0" * 64 + "; the golden set's digest is",
                 id="digest-differs"),
    pytest.param(["--golden", "{tmp}/nowhere"], "--golden: expected a folder; got '{tmp}/nowhere'", id="golden-missing"),
    pytest.param(["--backend", "spec", "--backend", "spec"], "--backend: each backend once; got spec more than once",
                 id="backend-repeated"),
    pytest.param(["--backend", ".relative:X"], "--backend .relative:X: expected an absolute module name", id="backend-relative"),
    pytest.param(["--dtype", "float8"], "--dtype: expected one of float32, float64, bfloat16, float16; got 'float8'",
                 id="dtype-float8"),
    pytest.param(["--dtype", "bfloat16", "--dtype", "int8"], "--dtype: expected one of float32, float64, bfloat16, "
                                                              "float16; got 'int8'", id="dtype-integer"),
    pytest.param(["--dt", "float8"], "--dtype: expected one of", id="dtype-abbreviated"),
    # the form a user most likely meant, and every form the option takes
    pytest.param(["--backend", "Torch"], "--backend: expected one of spec, torch, torch-onednn, jax, flax, jax-export, aoti, executorch, litert, onnxruntime, onnxruntime-opset23, "
                 "onnxruntime-integer, onnxruntime-loop, onnxruntime-loop-other-steps, onnx-reference, openvino, iree, tract, onnxruntime-node, "
                 "onnxruntime-web, 'package.module:object' or exec:\"CMD ARGS\"; got 'Torch'; did you mean 'torch'?",
                 id="backend-in-capitals"),
    pytest.param(["--backend", "mylib_odeattn.py"], "--backend: expected one of spec, ",
                 id="backend-a-file"),
    pytest.param(["--backend", "mylib_odeattn"], "--backend: expected one of spec, ", id="backend-a-module"),
    # not the README's mylib_odeattn: a user following the README saves that file in the clone
    pytest.param(["--backend", "port_not_in_this_folder:MyBackend"], "--backend port_not_in_this_folder:MyBackend: cannot "
                 "be loaded (ModuleNotFoundError: No module named 'port_not_in_this_folder'; run from the folder that holds "
                 "port_not_in_this_folder.py, or add that folder to PYTHONPATH)", id="backend-from-another-folder"),
])
def test_usage_errors_are_refused_in_one_line_with_exit_2(argv, message, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(["conformance", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # nothing ran: no header, no table
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("odeattn conformance: " + message.format(tmp=tmp_path)), lines


@pytest.mark.parametrize("name", ["mylib_odeattn.py", "mylib_odeattn"])
def test_a_module_given_as_a_backend_is_shown_the_reference_form(name, capsys):
    assert main(["conformance", "--backend", name]) == 2
    assert capsys.readouterr().err.strip().endswith(
        f"got {name!r}; a module's backend is named with its object, e.g. 'mylib_odeattn:MyBackend'")


CALLED_SPEC = '''
from odeattn.conformance.adapters import SpecAdapter


class CalledSpec(SpecAdapter):
    name = "spec"
'''


@pytest.mark.parametrize("with_spec", [False, True])
def test_a_plugin_named_as_a_builtin_backend_is_a_usage_error(tmp_path, monkeypatch, capsys, with_spec):
    """A plug-in whose name is the built-in spec's is known once its worker has built it: the run
    stops there, exit 2 (not a failed run, exit 1), no table and no report, its last line naming
    --backend; alone, that is the one line (beside spec, spec's own line may come first)."""
    (tmp_path / "odeattn_test_called_spec.py").write_text(CALLED_SPEC)
    monkeypatch.syspath_prepend(str(tmp_path))  # the workers get this process's sys.path
    code = main(["conformance", *(["--backend", "spec"] if with_spec else []), "--backend",
                 "odeattn_test_called_spec:CalledSpec", "-k", "derf", "--json", str(tmp_path / "r.json")])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and lines[-1] == ("odeattn conformance: --backend odeattn_test_called_spec:CalledSpec: reports the "
                                       "name 'spec', which another backend has taken; give it a name of its own"), lines
    assert len(lines) == 1 or (with_spec and len(lines) == 2 and lines[0].startswith("spec: ")), lines
    assert "backend errors" not in captured.out and not (tmp_path / "r.json").exists()


def test_a_builtin_backend_without_its_package_names_the_extra(capsys, monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else find_spec(name, *a))
    assert main(["conformance", "--backend", "torch"]) == 2
    assert capsys.readouterr().err.strip() == (
        "odeattn conformance: needs the package 'torch', which is not installed; install it with: pip install 'odeattn[torch]'")


def test_the_actions_have_their_own_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["conformance", "mutants", "--help"])
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("usage: odeattn conformance mutants [--golden GOLDEN] [-j N]")
    assert "mutation battery" in out and "verdict" in out and "--backend" not in out
    with pytest.raises(SystemExit):
        main(["conformance", "--help"])
    assert "--backend" in capsys.readouterr().out  # the whole command's, without an action


def test_the_help_shows_the_fuzz_options_apart_and_what_generate_needs(capsys):
    """The main help lists fuzz's options in a group of their own after the run's, --backend's
    placeholder has every form (exec: too), and generate's help says --golden or --packaged is needed."""
    with pytest.raises(SystemExit):
        main(["conformance", "--help"])
    out = capsys.readouterr().out
    run_part, _, fuzz_part = out.partition("\noptions:\n")[2].partition("\nfuzz options:\n")  # after the usage lines
    assert "--backend NAME|module:object|exec:CMD" in run_part and "--fail-fast" in run_part
    assert "--examples N" in fuzz_part and "--model FILE" in fuzz_part and "--examples" not in run_part
    with pytest.raises(SystemExit):
        main(["conformance", "generate", "--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: odeattn conformance generate [--golden GOLDEN] [--packaged]")
    assert "one of the two is required" in out and "default: the packaged set" not in out
    from odeattn.commands.conformance import ACTION_HELP
    from odeattn.commands.fuzz import FUZZ_ONLY

    assert set(FUZZ_ONLY.values()) <= set(ACTION_HELP["fuzz"][1])  # `conformance fuzz --help` shows every fuzz option


def test_a_bad_suite_file_exits_2_with_a_line_per_defect(tmp_path, capsys):
    shutil.copytree(golden.GOLDEN_DIR, tmp_path / "g")
    text = (tmp_path / "g" / "manifest.json").read_text()
    (tmp_path / "g" / "manifest.json").write_text(text.replace('"format": 7', '"format": "7"').replace('"padding": true', '"padding": 1', 1))
    (tmp_path / "g" / "notes.txt").write_text("stray")
    assert main(["conformance", "--golden", str(tmp_path / "g")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 3 and all(line.startswith("odeattn conformance: ") for line in lines), lines
    assert any("$.format: '7' is not one of [2, 3, 4, 5, 6, 7]" in line for line in lines), lines
    assert any("notes.txt: not listed in manifest.json" in line for line in lines)


def test_generate_refuses_an_unwritable_folder_in_one_line(capsys):
    assert main(["conformance", "generate", "--golden", "/proc/odeattn-golden"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("odeattn conformance generate: golden directory '/proc/odeattn-golden': not writable")


def test_a_team_set_prints_and_pins_its_digest(tmp_path, capsys):
    shutil.copytree(golden.GOLDEN_DIR, tmp_path / "g")
    set_digest = golden.digest(tmp_path / "g")
    argv = ["conformance", "--golden", str(tmp_path / "g"), "--backend", "spec", "-k", "derf_euler_encoder_float_nopad_s1_b2t5h2d8$"]
    assert main([*argv, "--expect-digest", set_digest]) == 0
    assert f"golden set: {tmp_path / 'g'}, 1 cases, digest {set_digest}" in capsys.readouterr().out


def test_expect_digest_takes_the_hex_digits_in_either_case(capsys):
    """The digest passes its check in upper case: what stops the run is the next check, --backend's."""
    upper = golden.digest().upper()
    assert main(["conformance", "--expect-digest", upper, "--backend", "tensorflow", "-k", "derf"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("odeattn conformance: --backend: expected one of") and "--expect-digest" not in err


def test_mutants_refuses_the_options_it_does_not_take(capsys):
    assert main(["conformance", "mutants", "-k", "derf"]) == 2
    assert capsys.readouterr().err.strip() == "odeattn conformance mutants: -k: not taken here (only --golden and -j)"


def test_mutants_refuses_a_folder_that_is_no_golden_set(tmp_path, capsys):
    assert main(["conformance", "mutants", "--golden", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "manifest.json: no such file" in err and err.startswith("odeattn conformance mutants: ")


# The main job's rows, (backend, dtype): every built-in backend whose packages are installed with
# CI's extras, in its default dtypes; flax and the JavaScript workers run on request.
MAIN_JOB_ROWS = {("spec", "float64"), ("torch", "float32"), ("torch", "float64"), ("torch", "bfloat16"), ("torch", "float16"), ("torch-onednn", "float32"),
                 ("jax", "float32"), ("jax", "float64"), ("jax", "bfloat16"), ("onnxruntime", "float32"), ("onnxruntime", "float16"),
                 ("onnxruntime", "bfloat16"), ("onnxruntime-opset23", "float32"), ("onnxruntime-integer", "float32"),
                 ("onnxruntime-loop", "float32"), ("onnxruntime-loop-other-steps", "float32"), ("onnx-reference", "float32")}


def test_the_main_job_s_parts_are_its_default_run(main_job):
    """`odeattn conformance` with no options runs MAIN_JOB_ROWS, notes the backends that run on
    request, and finds no backend error; the parts (tests/conftest.py) together run those rows."""
    from odeattn.conformance.adapters import BUILTIN, discover, make_adapter

    refs, notes, errors = discover()
    assert [r.label for r in refs] == sorted({b for b, _ in MAIN_JOB_ROWS}, key=list(BUILTIN).index) and not errors
    assert [n.split(":")[0] for n in notes] == ["flax", "jax-export", "aoti", "executorch", "litert", "openvino", "iree", "tract",
                                                "onnxruntime-node", "onnxruntime-web"]
    assert "runs on request (--backend flax)" in notes[0]
    for name in {b for b, _ in MAIN_JOB_ROWS}:  # a backend's rows are its adapter's dtypes
        assert set(make_adapter(BUILTIN[name].reference).dtypes) == {d for b, d in MAIN_JOB_ROWS if b == name}, name
    covered = [(b, d) for backends, dtypes in main_job.parts.values() for b in backends for d in dtypes or
               [d for n, d in MAIN_JOB_ROWS if n == b]]
    assert sorted(covered) == sorted(MAIN_JOB_ROWS)  # each row in one part


def test_the_main_job_runs_each_kind_on_every_builtin_backend_and_skips_as_declared(main_job, main_job_part):
    """`odeattn conformance` on its sample (tests/conftest.py's MAIN_JOB_SAMPLE), a part at a time: each case passes or is skipped
    where its row declares it cannot run it, in worker processes; float64 also within 1e-12 relative
    (the ports' float64 bar). Every golden case on every row is the main job itself, which CI runs
    whole (.ci/run)."""
    code, out, report = main_job(main_job_part)
    assert code == 0, out
    backends, dtypes = main_job.parts[main_job_part]
    rows = {(row["backend"], row["dtype"]): row for row in report["summary"]}
    assert set(rows) == {(b, d) for b, d in MAIN_JOB_ROWS if b in backends and (not dtypes or d in dtypes)}
    # every case passes everywhere, but the decode cases on opset 23, which has no decode models,
    # and on the Loop form, whose steps the cached models cannot take (their cache layout is
    # fixed), the grad cases on the exported graphs, which have no backward pass, and on the integer
    # BitLinear export, every case but the use_bitnet block cases; the encoder cases everywhere but
    # the spec, torch, jax and onnxruntime (the others have no run_encoder); the language model
    # cases everywhere but the spec and torch (the others have no run_lm)
    from odeattn.conformance.golden import load_cases

    cases = [c for c in load_cases() if c.name in main_job.sample]
    assert len(cases) == len(main_job.sample) == report["cases"]
    grad, decode, encoder, lm = ({c.name for c in cases if c.name.startswith(kind)}
                                 for kind in ("grad_", "decode_", "encoder_", "lm_"))
    bitnet_blocks = {c.name for c in cases if c.kind.name == "block" and c.config.use_bitnet}
    assert all((grad, decode, encoder, lm)) and len(bitnet_blocks) >= 4
    # a half row runs no case the golden set marks untestable in its dtype (the grad and encoder
    # cases among them); ONNX Runtime's half export has no decode models
    for key, row in rows.items():
        untestable = {c.name for c in cases if key[1] in ("float16", "bfloat16") and c.untestable(key[1])}
        skipped = {"jax": lm, "onnxruntime": grad | lm | (decode if untestable else set()), "onnx-reference": grad | encoder | lm,
                   "onnxruntime-opset23": grad | decode | encoder | lm,
                   "onnxruntime-loop": grad | decode | encoder | lm, "onnxruntime-loop-other-steps": grad | decode | encoder | lm,
                   "onnxruntime-integer": {c.name for c in cases} - bitnet_blocks}.get(key[0], set()) - untestable
        assert (row["passed"], row["skipped"], row["untestable"], row["failed"]) == (
            report["cases"] - len(skipped) - len(untestable), len(skipped), len(untestable), 0), key
    assert not report["backend_errors"] and not report["notes"]


SMALL = "derf_euler_encoder_float_nopad_s1_b2t5h2d8$"  # one block case, one step of euler


def test_profile_counts_jax_s_compilations_cold_and_its_cache_hits_warm(tmp_path, monkeypatch, capsys):
    """--profile: per backend, the phases and what it compiled; JAX's persistent cache (under
    XDG_CACHE_HOME) empty at first, then read back; ONNX Runtime exports and builds one session for
    the case's f0 and trajectory both."""
    pytest.importorskip("jax")
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    argv = ["conformance", "--backend", "jax", "--backend", "onnxruntime", "-k", SMALL, "--profile", "--json"]
    runs, said = [], []
    for name in ("cold", "warm"):
        assert main([*argv, str(tmp_path / f"{name}.json")]) == 0
        out, err = capsys.readouterr()
        said.append([line for line in err.splitlines() if "JAX compiling" in line])
        assert "profile (seconds;" in out and any(line.startswith("jax ") for line in out.split("profile (")[1].splitlines())
        runs.append(json.loads((tmp_path / f"{name}.json").read_text())["profile"]["backends"])
    cold, warm = runs
    assert len(said[0]) == 1 and said[0][0].startswith("jax: JAX compiling: ") and not said[1]  # the progress says so, cold only
    assert cold["jax"]["programs"] >= 2 and cold["jax"]["cache_hits"] == 0  # a program a dtype at least
    assert cold["jax"]["xla_compilations"] == cold["jax"]["programs"] and cold["jax"]["compilation"] > 0
    assert warm["jax"]["programs"] == cold["jax"]["programs"] == warm["jax"]["cache_hits"]
    assert warm["jax"]["xla_compilations"] == 0
    assert any((tmp_path / "cache" / "odeattn" / "jax").iterdir())
    for run in runs:
        # one export and session a dtype (float32, float16, bfloat16)
        assert (run["onnxruntime"]["exports"], run["onnxruntime"]["sessions"], run["onnxruntime"]["programs"]) == (3, 3, 0)
        assert run["jax"]["import"] > 0 and run["jax"]["workers"] >= 1 and run["jax"]["exports"] == 0


def test_a_process_keeps_the_jax_cache_folder_it_has(tmp_path):
    """jax_with_cache() with another XDG_CACHE_HOME later in the process (a test's own, a user's)
    leaves the folder: JAX writes to the first one whatever the config says later, and a later
    folder only enters the cache keys, so a second process (the same steps) finds its programs."""
    import os
    import subprocess
    import sys

    pytest.importorskip("jax")
    code = ("import json, os, sys, jax.numpy as jnp\n"
            "from odeattn.conformance.adapters import jax_with_cache\n"
            "from odeattn.conformance.wire import counters\n"
            "jax = jax_with_cache(); counters.watch_jax(); before = counters.snapshot()\n"
            "jnp.sin(jnp.arange(3.0)).block_until_ready()\n"
            "os.environ['XDG_CACHE_HOME'] = sys.argv[1]\n"
            "jax_with_cache(); jnp.cos(jnp.arange(3.0)).block_until_ready()\n"
            "print(json.dumps([jax.config.jax_compilation_cache_dir, counters.since(before)]))\n")
    env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"} | {"XDG_CACHE_HOME": str(tmp_path / "first")}
    said = []
    for later in ("later-1", "later-2"):  # another later folder each time, as a test's tmp_path is
        done = subprocess.run([sys.executable, "-c", code, str(tmp_path / later)], env=env, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        said.append(json.loads(done.stdout.splitlines()[-1]))
    (folder_1, run_1), (folder_2, run_2) = said
    assert folder_1 == folder_2 == str(tmp_path / "first" / "odeattn" / "jax") and not (tmp_path / "later-1").exists()
    assert run_1["cache_hits"] < run_1["programs"] and run_2["cache_hits"] == run_2["programs"] >= 2, said  # the second compiles nothing


PLUGIN = '''
import os, sys
import ode_ref as R

class Mine:
    """A user's own backend: the spec in float64, which notes the runtimes its worker has imported."""
    name, dtypes = "mine", ("float64",)

    def supports(self, config, dtype):
        return None

    def run_block(self, config, params, x, padding_mask, dtype):
        with open(os.environ["ODEATTN_TEST_IMPORTED"], "a") as f:
            f.write(" ".join(sorted(m for m in ("jax", "jaxlib", "torch", "onnxruntime") if m in sys.modules)) + "\\n")
        return R.ode_block(params, x, config, padding_mask)
'''


def test_a_users_own_backend_never_imports_or_compiles_the_jax_port(tmp_path):
    """`odeattn conformance --backend module:object`: neither the command's process nor the
    workers import JAX (nor torch, nor ONNX Runtime), and no JAX cache folder is made."""
    import os
    import subprocess
    import sys

    (tmp_path / "odeattn_test_mine.py").write_text(PLUGIN)
    code = ("import sys\nfrom odeattn.cli import main\n"
            "code = main(['conformance', '--backend', 'odeattn_test_mine:Mine', '-k', 'derf', '--json', 'r.json'])\n"
            "print('parent:', sorted(m for m in ('jax', 'jaxlib', 'torch', 'onnxruntime') if m in sys.modules))\n"
            "sys.exit(code)\n")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "ODEATTN_TEST_IMPORTED": str(tmp_path / "imported")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "parent: []"
    seen = (tmp_path / "imported").read_text().splitlines()
    assert seen and set(seen) == {""}, set(seen)  # a line a case run, each empty
    assert json.loads((tmp_path / "r.json").read_text())["profile"]["backends"]["mine"]["programs"] == 0
    assert not (tmp_path / "cache" / "odeattn").exists()


# one case of each kind the flax backend runs (block, f, decode, gradient, encoder), the gated
# solver, padding, positions and BitLinear among them; the whole set on flax is a run of minutes
FLAX_CASES = ["block_dynamic_tanh_rk2_gated_decoder_bitnet_pad_s2_b1t1h1d6_positions-rope",
              "block_alibi_h3_decoder_pad_large", "decode_rk2_gated_rms_norm_rope_pad",
              "grad_flash_norm_rk2_gated_encoder_bitnet_pad_s2_none_b2t5h2d8",
              "encoder_rk2_gated_released_post_pad_l2_b2t5h2c8f12"]


def test_the_flax_backend_runs_when_asked_for(tmp_path, capsys):
    pytest.importorskip("flax")
    code = main(["conformance", "--backend", "flax", "--float64-bound", "1e-12", "--json", str(tmp_path / "r.json"),
                 *[a for c in FLAX_CASES for a in ("-k", f"^{c}$")]])
    assert code == 0, capsys.readouterr().out
    report = json.loads((tmp_path / "r.json").read_text())
    assert sorted((r["dtype"], r["case"], r["status"]) for r in report["results"]) == sorted(
        (d, c, "passed") for d in ("float32", "float64") for c in FLAX_CASES)


def _snapshot(folder):
    return {p.name: p.read_bytes() for p in folder.iterdir()}


@pytest.mark.parametrize("argv, message", [
    pytest.param([], "generate: expected --golden DIR (a new or empty folder, or one holding a golden set) or --packaged "
                 "(rewrite the packaged, sealed set in place); got neither", id="neither"),
    pytest.param(["--golden", "{tmp}", "--packaged"], "; got both", id="both"),
])
def test_generate_writes_the_packaged_set_only_when_asked(tmp_path, argv, message, capsys):
    """A bare `conformance generate` would rewrite the set inside the installed package."""
    before = (golden.GOLDEN_DIR / golden.MANIFEST).stat().st_mtime_ns
    assert main(["conformance", "generate", *[a.format(tmp=tmp_path) for a in argv]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("odeattn conformance generate: ") and message in err[0], err
    assert (golden.GOLDEN_DIR / golden.MANIFEST).stat().st_mtime_ns == before


@pytest.mark.parametrize("argv, named", [
    pytest.param(["-k", "derf"], "-k", id="k"),
    pytest.param(["--exclude", "grad", "--dtype", "float32"], "--dtype, --exclude", id="exclude-dtype"),
    pytest.param(["--backend", "spec", "--json", "{tmp}/r.json"], "--backend, --json", id="backend-json"),
])
def test_generate_refuses_the_options_it_would_ignore(tmp_path, argv, named, capsys):
    """generate writes the whole set from the spec: a case selection or a run's option is refused
    by name, not ignored, before anything is written."""
    assert main(["conformance", "generate", "--golden", str(tmp_path / "set"), *[a.format(tmp=tmp_path) for a in argv]]) == 2
    assert capsys.readouterr().err == (f"odeattn conformance generate: {named}: not taken by generate (only --golden DIR "
                                       "or --packaged)\n")
    assert not (tmp_path / "set").exists()


def test_packaged_is_generate_s_option_only(capsys):
    assert main(["conformance", "--packaged", "-k", "x"]) == 2
    assert capsys.readouterr().err.strip() == "odeattn conformance: --packaged: taken by generate only; got the action run"


@pytest.mark.parametrize("files", [
    pytest.param({"weights.safetensors": b"my weights"}, id="a-user-s-weights"),
    pytest.param({"manifest.json": b'{"mine": true}', "w.safetensors": b"mine"}, id="a-foreign-manifest"),
    pytest.param({"notes.txt": b"mine"}, id="any-other-file"),
])
def test_generate_refuses_a_folder_that_holds_no_golden_set_and_touches_nothing(tmp_path, files, capsys):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    assert main(["conformance", "generate", "--golden", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"odeattn conformance generate: golden directory {str(tmp_path)!r}: expected an "
                                               "empty folder or one holding a golden set (its manifest.json); it holds "), err
    assert _snapshot(tmp_path) == files


def test_generate_replaces_only_the_files_of_the_set_it_finds(tmp_path):
    """Into a folder holding a golden set: its own case files are replaced or removed (a case gone
    from the set), a user's file beside them is kept, and one named as a case is refused."""
    from odeattn.conformance.cases import build_case, case_specs

    specs = case_specs()[:3]
    golden.write_golden(tmp_path, cases=[build_case(s) for s in specs[:2]])
    (tmp_path / "mine.safetensors").write_bytes(b"mine")
    golden.write_golden(tmp_path, cases=[build_case(specs[0])])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["manifest.json", "mine.safetensors", specs[0].name + ".safetensors"])
    assert (tmp_path / "mine.safetensors").read_bytes() == b"mine"
    (tmp_path / f"{specs[2].name}.safetensors").write_bytes(b"mine too")
    with pytest.raises(ValueError, match=rf"{specs[2].name}.safetensors is not a file of its golden set's manifest.json"):
        golden.write_golden(tmp_path, cases=[build_case(s) for s in specs])
    assert (tmp_path / f"{specs[2].name}.safetensors").read_bytes() == b"mine too"
    assert [e["name"] for e in json.loads((tmp_path / "manifest.json").read_text())["cases"]] == [specs[0].name]


def test_a_manifest_cannot_point_generate_outside_its_folder(tmp_path):
    """A manifest listing '../x.safetensors' is not a golden set's: nothing outside is removed."""
    (tmp_path / "set").mkdir()
    (tmp_path / "x.safetensors").write_bytes(b"mine")
    (tmp_path / "set" / "manifest.json").write_text(json.dumps({"format": 6, "cases": [{"file": "../x.safetensors"}]}))
    with pytest.raises(ValueError, match="expected an empty folder or one holding a golden set"):
        golden.write_golden(tmp_path / "set", cases=[])
    assert (tmp_path / "x.safetensors").read_bytes() == b"mine"


def kill_row(name, policy=False, f32=3, f64=3, smallest="bfloat16", errors=0):
    return {"mutant": name, "target": "policy" if policy else "f", "bug": "a bug", "policy": policy, "cases": 5,
            "killed_float32": f32, "killed_float64": f64, "smallest_dtype": smallest, "first_divergence": "f0",
            "errors": errors, "ignores": None, "ran_float64": 5}


@pytest.mark.parametrize("rows, code, verdict", [
    pytest.param([kill_row("a"), kill_row("p", policy=True)], 0,
                 "verdict: all 2 mutants killed (1 in float32 and float64, 0 of them a config field ignored; 1 policy mutants in bfloat16)", id="all-killed"),
    pytest.param([kill_row("a"), kill_row("b", f32=0, f64=0, smallest="-")], 1,
                 "verdict: 1 of 2 mutants survived in float32 or float64 (a policy mutant: in bfloat16), or errored: b",
                 id="one-survived"),
])
def test_mutants_ends_in_a_verdict_and_marks_what_was_not_run(rows, code, verdict, capsys, monkeypatch):
    """The kill table ends in a verdict line; a policy mutant's float32/float64 cell says it was not
    run there, and a survivor's smallest dtype says so, never a bare '-'."""
    from odeattn.conformance.mutation import mutants

    monkeypatch.setattr(mutants, "kill_table", lambda cases, jobs, progress: rows)
    assert main(["conformance", "mutants"]) == code
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == verdict
    cells = {line.split("`")[1]: [c.strip() for c in line.split("|")[3:5]] for line in lines[2:-1] if line.startswith("| `")}
    assert cells["a"] == ["3 / 3 of 5", "bfloat16"]
    assert cells.get("p", ["not run (half dtypes only)", "bfloat16"]) == ["not run (half dtypes only)", "bfloat16"]
    assert cells.get("b", ["0 / 0 of 5", "none: survived"]) == ["0 / 0 of 5", "none: survived"]
