"""What the tests of odeattn's plots share: the figure a plot function draws, read instead of written."""

import pytest


@pytest.fixture
def drawn_figure(monkeypatch):
    """A function: draw(path) -> the one figure draw saves, kept open to read (nothing is written)."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: saved.append(fig))
    monkeypatch.setattr(plt, "close", lambda fig=None: None)

    def drawn(draw):
        saved.clear()
        draw("unused.png")
        (fig,) = saved
        return fig

    return drawn
