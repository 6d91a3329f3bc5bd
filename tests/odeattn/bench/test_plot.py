"""The bench's scaling plot (odeattn.bench.plot): each panel shows its data in its unit."""

import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from odeattn.bench import plot_scaling
from odeattn.plotting import pyplot

BENCH = Path(__file__).resolve().parents[3] / "docs" / "bench.json"


def test_the_file_size_panel_shows_both_forms_in_kb_with_the_growth_visible(tmp_path, monkeypatch):
    """docs/bench.json's scaling lines: the default export's file grows with the steps and the
    local functions' stays flat; both lines are drawn in kB inside the axis (not one flat line of
    bytes squeezed against an axis from zero to 1e6)."""
    plt = pyplot()
    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to read its axes
    result = json.loads(BENCH.read_text())
    plot_scaling(result, tmp_path / "bench.png")
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    size = next(ax for ax in figures[0].axes if ax.get_title() == "ONNX file size vs steps")
    assert size.get_ylabel() == "kB"
    lines = {line.get_label(): list(line.get_ydata()) for line in size.get_lines()}
    rows = result["scaling"]["export_vs_steps"]
    assert lines == {"default (every step written out)": pytest.approx([r["inlined_bytes"] / 1e3 for r in rows]),
                     "--functions (local functions)": pytest.approx([r["bytes"] / 1e3 for r in rows])}
    low, high = size.get_ylim()
    assert low == 0 and max(max(v) for v in lines.values()) < high < 1.2 * max(max(v) for v in lines.values())
    monkeypatch.undo()  # plt.close is the recorder until then: the kept figure is closed for real
    plt.close("all")
