"""matplotlib on its file-only backend, for every plot the project writes. A leaf module."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend: no display needed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
