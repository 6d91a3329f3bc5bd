"""Checks of a block's weights before they are exported or run. NumPy only (no onnx import), so
every command that reads weights can use it."""

from __future__ import annotations

import numpy as np


def check_finite(params: dict) -> None:
    """ValueError naming the first parameter that holds NaN or Inf."""
    for name, value in params.items():
        if not np.isfinite(value).all():
            raise ValueError(f"params[{name!r}] holds NaN or Inf; a block with them computes nothing useful")
