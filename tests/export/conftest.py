import pytest


@pytest.fixture
def refused_in_one_line(capsys):
    """check(argv, changed, message): the command argv, with its items at the indices of changed
    replaced (index -> value), exits 2 and prints one line holding message."""
    from odeattn.cli import main

    def check(argv, changed: dict, message: str) -> None:
        args = list(argv)
        for i, value in changed.items():
            args[i] = value
        capsys.readouterr()
        assert main(args) == 2
        line, = capsys.readouterr().err.strip().splitlines()
        assert message in line, line

    return check


@pytest.fixture
def runs_alone(tmp_path):
    """check(runner, call, cfg, params): runner (a module's file, or None) copied beside the artifact
    in tmp_path and call (Python code that reads x.npy and mask.npy and saves z.npy) run by a fresh
    process that imports neither odeattn, ode_ref, onnx, jax nor torch, at two shapes with a row
    padded on the left; z(1) within the suite's float32 rule against the spec each time."""
    import os
    import shutil
    import subprocess
    import sys

    import numpy as np

    import ode_ref as R
    from odeattn.conformance.cases.tolerance import relative_error, tolerance

    def check(runner, call: str, cfg, params) -> None:
        if runner is not None:
            shutil.copy(runner, tmp_path)
        code = (f"import sys, numpy as np; {call}; "
                "assert not [m for m in sys.modules if m.split('.')[0] in ('odeattn', 'ode_ref', 'onnx', 'jax', 'torch')]")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        rng = np.random.default_rng(0)
        for shape in ((3, 5, cfg.hidden_size), (1, 11, cfg.hidden_size)):
            x, mask = rng.normal(size=shape), np.ones(shape[:2], bool)
            mask[0, :2] = False
            np.save(tmp_path / "x.npy", x.astype(np.float32))
            np.save(tmp_path / "mask.npy", mask)
            subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, check=True)
            want = R.ode_block(params, x, cfg, mask)
            spec32 = relative_error(R.ode_block(params, x.astype(np.float32), cfg, mask), want)
            assert relative_error(np.load(tmp_path / "z.npy"), want) <= tolerance(spec32, "float32"), shape

    return check
