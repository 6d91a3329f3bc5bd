"""Matrix cases for the backend tests: each row of matrix.pairwise with fair inputs and the spec's
float64 and float32 results (computed once per test session, kept in memory)."""

from __future__ import annotations

import functools
from typing import NamedTuple, Optional

import numpy as np

import ode_ref as R

from .matrix import FACTORS, config_of, make_inputs, pairwise
from .tolerance import relative_error


class MatrixCase(NamedTuple):
    name: str
    config: R.ODEConfig
    params: dict
    x: np.ndarray  # float64 (batch, seq, d_model)
    padding_mask: Optional[np.ndarray]
    trajectory: np.ndarray  # float64 (steps + 1, batch, seq, d_model), the spec's
    e32: float  # the spec's own float32 relative error on the trajectory


def case_name(row: dict) -> str:
    b, t, h, d = row["shape"]
    return (f"{row['norm_type']}-{row['ode_solver']}-{row['mode']}-{'bit' if row['use_bitnet'] else 'float'}"
            f"-{'pad' if row['padding'] else 'nopad'}-s{row['ode_steps']}-b{b}t{t}h{h}d{d}")


@functools.lru_cache(maxsize=None)
def matrix_cases() -> tuple[MatrixCase, ...]:
    cases = []
    for i, row in enumerate(pairwise(FACTORS)):
        cfg = config_of(row)
        b, t, _, _ = row["shape"]
        params = R.init_params(cfg, seed=i, perturb_norms=True)
        x, mask, _ = make_inputs(cfg, params, b, t, seed=1000 * i, padding=row["padding"])
        _, traj = R.ode_block(params, x, cfg, mask, return_trajectory=True)
        _, traj32 = R.ode_block(params, x.astype(np.float32), cfg, mask, return_trajectory=True)
        cases.append(MatrixCase(case_name(row), cfg, params, x, mask, traj, relative_error(traj32, traj)))
    return tuple(cases)
