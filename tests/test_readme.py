"""The README's Python examples run as written."""

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_python_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    pytest.importorskip("onnx")
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    monkeypatch.chdir(tmp_path)  # the example writes block.onnx
    namespace = {}
    exec(blocks[0], namespace)  # the quick tour
    exec(blocks[1], namespace)  # the variant, as written
    R, ns = namespace["R"], namespace
    shipped = R.ode_block(ns["params"], ns["x"], ns["cfg"], ns["mask"], attention=R.LocalWindowAttention(ns["cfg"], window=2))
    assert (ns["z_local"] == shipped).all() and not (ns["z_local"] == ns["z1"]).all()
    assert ns["onnx_local"].graph.node and type(ns["z_torch_local"].ode_func).__name__ == "LocalWindow"
    assert namespace["z1"].shape == namespace["z_jax"].shape == (2, 10, 64)
    exec(blocks[2], namespace)  # positions and cached decoding (it asserts its own equality)
    assert namespace["cache"].index == 8 and namespace["z_next"].shape == (2, 1, 64)
    assert (tmp_path / "block.onnx").stat().st_size > 0
