import contextlib
import functools
import importlib.util
import io
import json
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# Bytecode caches on, whatever PYTHONDONTWRITEBYTECODE says: the suite starts hundreds of Python
# processes (conformance workers, commands, pytest runs of a port's tests), and without the caches
# each one compiles the project's modules again, and pytest rewrites the plugin's asserts again.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The test processes (-n auto, one per core) share the cores: each keeps its math libraries, and
# the conformance workers it starts (conformance.running.pool.worker_threads), to one thread.
# Threads beyond the cores wait at each other's barriers whenever the other process runs.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "ODEATTN_WORKER_THREADS"):
        os.environ.setdefault(_name, "1")

# Every JAX program of the suite (in the test processes and in every process they start: the main
# job's workers, the subprocesses) compiles with XLA's classic CPU fusion emitters in one codegen
# part, with LLVM's optimisation off (level 0; tests/backends/jax cold took half the CPU it took at
# the default level 3). The golden cases' outputs they change (by a few roundings with the first
# two; level 0's not measured) are judged under XLA's defaults by the main job, which CI runs whole
# with XLA_FLAGS as given (.ci/run, docs/development.md#running-the-tests); `--xla-defaults` runs
# the whole suite so too. A test whose claim rests on the code of XLA's default LLVM level compiles
# its programs at that level (the fixture jit_at_xla_default).
SUITE_XLA_FLAGS = ("--xla_cpu_use_fusion_emitters=false", "--xla_cpu_parallel_codegen_split_count=1",
                   "--xla_backend_optimization_level=0")


def pytest_addoption(parser):
    parser.addoption("--xla-defaults", action="store_true",
                     help="compile JAX under XLA's defaults (XLA_FLAGS as given), not with the suite's cheaper options")


def pytest_configure(config):
    """XLA_FLAGS with SUITE_XLA_FLAGS added, a user's own flags kept (an option they name stays as
    they gave it): set before any test runs JAX, which reads it when its CPU backend starts."""
    if not config.getoption("xla_defaults"):
        given = os.environ.get("XLA_FLAGS", "").split()
        names = {f.split("=")[0] for f in given}
        os.environ["XLA_FLAGS"] = " ".join(given + [f for f in SUITE_XLA_FLAGS if f.split("=")[0] not in names])


# Hypothesis' example counts, by profile: `ci` (the default, what `python -m pytest -q` runs) draws
# the same examples on every run; `dev` (`--hypothesis-profile dev`) draws a few, for a quick look.
_SHARED = dict(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=25, **_SHARED)
settings.register_profile("dev", max_examples=5, **_SHARED)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def jax_persistent_cache():
    """Every test process keeps JAX's compilations in the project's persistent cache, as the main
    job's workers do (conformance.adapters.jax_with_cache): with the cache filled no test compiles
    a program again, whichever process runs it and whatever ran there before."""
    if importlib.util.find_spec("jax") is not None:
        from odeattn.conformance.adapters import jax_with_cache

        jax_with_cache()


@pytest.fixture(scope="session")
def jit_at_xla_default():
    """jax.jit compiling at XLA's default LLVM level (3), whatever SUITE_XLA_FLAGS say (their other
    two options kept; jax.jit's compiler_options): for a test whose claim rests on that code."""
    import functools

    import jax

    return functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 3})


@pytest.fixture(scope="session")
def builtin_adapter():
    """name -> that built-in backend's adapter, made once per test process: an adapter made anew
    holds new jitted functions, so JAX traces (and looks up or compiles) its programs again."""
    from odeattn.conformance.adapters import BUILTIN, make_adapter

    return functools.cache(lambda name: make_adapter(BUILTIN[name].reference))


# The main job, `odeattn conformance` (every golden case on every built-in backend and dtype), is
# the quick start's first command, and CI runs it whole beside the suite (.ci/run): its JAX rows
# alone compile about 600 XLA programs, minutes with empty caches. The suite runs it on MAIN_JOB_SAMPLE,
# a case of each kind and of each way a row skips one, in parts: part -> (its backends, its dtypes;
# none: the backends' own). Each part is a test of its own (tests/odeattn/commands/test_conformance.py),
# so the test processes share the job; together the parts are the job's default run, which that file
# checks too.
MAIN_JOB = {**{f"jax-{d}": (["jax"], [d]) for d in ("float32", "float64", "bfloat16")},
            "torch": (["torch", "torch-onednn"], []), "onnxruntime": (["onnxruntime"], []),
            "onnx-other": (["onnxruntime-opset23", "onnxruntime-integer", "onnxruntime-loop", "onnxruntime-loop-other-steps",
                            "onnx-reference"], []), "spec": (["spec"], [])}
MAIN_JOB_SAMPLE = (
    "block_derf_euler_encoder_float_nopad_s1_b2t5h2d8",  # a float block: skipped by the integer BitLinear export
    "block_derf_rk2_gated_encoder_float_nopad_s1_b2t5h2d8",  # the gated solver
    "block_rk4_s8_decoder_bitnet_pad_dyt",  # 8 steps (the other-steps row feeds 4); untestable in float16
    "block_layer_norm_heun_decoder_bitnet_pad_s8_b3t7h3d12",  # untestable in bfloat16
    "block_dynamic_tanh_midpoint_decoder_bitnet_pad_s2_b1t1h1d6_positions-alibi", "block_rope_decoder_bitnet_pad",
    "block_large_magnitude_layer_norm_bitnet_decoder",  # BitLinear blocks with alibi, rope, magnitude 10^3
    "grad_rms_norm_euler_encoder_bitnet_pad_s2_rope_b1t4h1d6",  # no backward pass in the exported graphs
    "decode_rk38_derf_rope_bitnet_pad_odd_head_dim",  # cached decoding: not in opset 23, Loop, integer or half ONNX
    "encoder_euler_paper_post_nopad_l1_b2t5h2c8f12",  # run_encoder: the spec, torch, jax and onnxruntime
    "lm_rope_bitnet_rms_heun_s3_ssmax_padded_pad",  # run_lm: the spec and torch
)


def pytest_collection_modifyitems(items):
    """The tests of an xdist group first (a costly fixture shared: the kill table, the compiled
    packages, the main job's parts): each group runs in one process, so one started last would
    leave the other process idle until it ends."""
    items.sort(key=lambda item: item.get_closest_marker("xdist_group") is None)


def pytest_generate_tests(metafunc):
    """A test taking `main_job_part` runs once per part, in the part's xdist group: the tests that
    read a part share its group (`main-job-PART`), so one process runs it, once."""
    if "main_job_part" in metafunc.fixturenames:
        metafunc.parametrize("main_job_part", [pytest.param(p, marks=pytest.mark.xdist_group(f"main-job-{p}")) for p in MAIN_JOB])


@pytest.fixture(scope="session")
def main_job(tmp_path_factory):
    """part -> (exit status, what it printed, its --json report): that part of the main job on
    MAIN_JOB_SAMPLE, run once per test process, one worker process at a time (the test processes are the parallelism),
    float64 also within 1e-12 relative (the ports' float64 bar), JAX under SUITE_XLA_FLAGS."""
    from odeattn.cli import main

    @functools.cache
    def run(part):
        backends, dtypes = MAIN_JOB[part]
        path = tmp_path_factory.mktemp("main-job") / f"{part}.json"
        argv = ["conformance", "-j", "1", "--float64-bound", "1e-12", "--json", str(path),
                "-k", f"^({'|'.join(MAIN_JOB_SAMPLE)})$"]
        argv += [a for b in backends for a in ("--backend", b)] + [a for d in dtypes for a in ("--dtype", d)]
        with contextlib.redirect_stdout(io.StringIO()) as out:
            code = main(argv)
        return code, out.getvalue(), json.loads(path.read_text())

    run.parts, run.sample = MAIN_JOB, MAIN_JOB_SAMPLE
    return run


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def bfloat16_tanh():
    """make(path=None) -> a model x bfloat16 [batch, seq, 8] -> z = Tanh(x) in bfloat16 (saved at
    path if given): an operator ONNX Runtime's CPU provider has no bfloat16 kernel for (nor MatMul,
    Add, Exp, Sqrt: measured, ONNX Runtime 1.32), where a half export computes in float32."""
    def make(path=None):
        import onnx
        from onnx import TensorProto, helper

        vi = helper.make_tensor_value_info
        graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["z"])], "g", [vi("x", TensorProto.BFLOAT16, ["b", "t", 8])],
                                  [vi("z", TensorProto.BFLOAT16, ["b", "t", 8])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
        if path is not None:
            onnx.save(model, path)
        return model
    return make
