"""The floor under the main job's JAX time: the suite's JAX rows, each compiling f once and nothing else.

FloorJax is a backend that, for every row the `jax` backend runs, traces, lowers and compiles one
evaluation of f: the port's ode_func at the case's config, shape and dtype (a decode row: on the
prompt; a grad row: jax.vjp of that one evaluation), with no steps, stages, trajectory, cache or
backward pass of the block. A JAX port that jits each row at its own shapes compiles at least that
much for the suite: f at each config, shape and dtype. f does not depend on the solver or the
steps, so the floor keys f by the config with those two fixed (f_config): rows that differ only
there share one program, as they could in any port. Its outputs are not the cases' (its rows fail
their comparisons, and the encoder rows are skipped, which only lowers the floor); its profile is
the figure. floor_rows runs it through `odeattn conformance --profile` as the main job runs the
`jax` backend, JAX's persistent cache in an empty folder (cold) and then filled (warm).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from ode_ref.multistep import with_solver
from ode_ref.params import GATE_BIAS, GATE_WEIGHT
from odeattn.conformance.adapters import JaxAdapter
from odeattn.conformance.adapters.protocol import NotSupported

FLOOR = "odeattn.bench.floor:FloorJax"  # the floor as `odeattn conformance --backend` names it


def f_config(config, params: dict):
    """(config with euler x 1, params without the gate's): f's own key, the same for every solver
    and step count (the gate belongs to the gated solver, not to f)."""
    f_params = {k: v for k, v in params.items() if k not in (GATE_WEIGHT, GATE_BIAS)}
    return with_solver(config, "euler", ode_steps=1), f_params


ROW = ("wall", "import", "compilation", "jax_trace", "jax_lower", "jax_xla", "run", "programs", "cache_hits",
       "xla_compilations")  # what a row keeps of the backend's profile


class FloorJax(JaxAdapter):
    """Every row's f once: run_func and run_trajectory return f(0, x) (the trajectory as one
    state), run_vjp the vjp of f, run_decode f on the prompt. Not a conforming backend: a floor."""

    name = "jax-floor"

    def __init__(self):
        super().__init__()
        port, jax = self.port, self.jax

        def f_vjp(params, x, padding_mask, bar, config):
            _, back = jax.vjp(lambda p, xx: port.ode_func(p, 0.0, xx, config, padding_mask), params, x)
            params_bar, x_bar = back(bar)
            return x_bar, params_bar

        self._f_vjp = jax.jit(f_vjp, static_argnames=("config",))

    def _run(self, config, params, x, padding_mask, dtype):
        config, params = f_config(config, params)
        with self.jax.enable_x64(dtype == "float64"):
            f0 = np.asarray(self._func(params, 0.0, x, config, padding_mask))
        return f0, f0[None]

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        f_cfg, f_params = f_config(config, params)
        with self.jax.enable_x64(dtype == "float64"):
            x_bar, params_bar = self._f_vjp(f_params, x, padding_mask, z1_bar, config=f_cfg)
        zeros = {k: np.zeros_like(v) for k, v in params.items() if k not in params_bar}  # the gate's: not f's
        return np.asarray(x_bar), {**{k: np.asarray(v) for k, v in params_bar.items()}, **zeros}

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        mask = None if padding_mask is None else padding_mask[:, :prompt]
        return self._run(config, params, x[:, :prompt], mask, dtype)[0]

    def run_encoder(self, config, params, x, padding_mask, dtype):
        raise NotSupported("the floor leaves the encoder rows out")


def profile_row(backend: str, cache_home: str, args=()) -> dict:
    """The backend's row of `odeattn conformance --backend B --profile --json` (more arguments in
    args), JAX's persistent cache under cache_home; the run's own wall time as "run_wall"."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "odeattn", "conformance", "--backend", backend, *args, "--profile", "--json", str(out)]
        # no check: the floor's rows fail their comparisons, so the run exits 1 by design
        done = subprocess.run(command, env=dict(os.environ, XDG_CACHE_HOME=cache_home), capture_output=True, text=True)
        if not out.exists():
            tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
            raise RuntimeError(f"`odeattn conformance --backend {backend}` wrote no report: {tail[0]}")
        profile = json.loads(out.read_text())["profile"]
    row = next(iter(profile["backends"].values()))
    return {"run_wall": profile["wall"], **{k: row[k] for k in ROW}}


def floor_rows(backends=(FLOOR,), args=(), log=print) -> dict:
    """{"<backend> cold" | "<backend> warm": profile_row}: each backend cold, its persistent cache
    in a new empty folder, then warm from that folder; one line each to log."""
    rows = {}
    for backend in backends:
        with tempfile.TemporaryDirectory() as cache_home:
            for state in ("cold", "warm"):
                rows[f"{backend} {state}"] = row = profile_row(backend, cache_home, args)
                log(f"{backend:<24}{state:>5}: run {row['run_wall']:.1f} s, backend wall {row['wall']:.1f} s; "
                    f"trace / lower / XLA {row['jax_trace']:.1f} / {row['jax_lower']:.1f} / {row['jax_xla']:.1f} s "
                    f"summed; {row['programs']} programs, {row['xla_compilations']} compiled")
    return rows
