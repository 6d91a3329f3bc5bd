"""Each backend module mirrors its spec module: the spec's public functions and classes exist
under the same names in the port (a port may add names, never drop or rename one)."""

import importlib
import inspect

import pytest

MODULES = ["norms", "bitlinear", "attention", "variants"]
STAGES = ["prepare", "build_mask", "project", "preprocess_qkv", "attn", "postprocess_attn", "output_proj", "evaluate"]


# Spec names a port does without, and why.
REPLACED = {
    ("torch", "attention"): {"softmax", "masked_fill_min"},  # fused into scaled_dot_product_attention
    ("torch", "norms"): {"erf"},  # torch.erf
    ("jax", "norms"): {"erf"},  # jax.scipy.special.erf
    ("export", "norms"): {"erf"},  # the Erf node
    ("export", "bitlinear"): {"weight_scale"},  # done at export time by the spec's ternarize_weight
    ("export", "attention"): {"positions_from_padding"},  # no exportable stage reads positions
}
PORTS = {"torch": "odeattn.backends.torch", "jax": "odeattn.backends.jax", "export": "odeattn.export"}


def public(module, own_only=True):
    return {
        n for n, v in vars(module).items()
        if not n.startswith("_") and callable(v) and not inspect.ismodule(v)
        and (getattr(v, "__module__", None) == module.__name__ or not own_only)
    }


@pytest.mark.parametrize("backend", ["torch", "jax", "export"])
@pytest.mark.parametrize("name", MODULES)
def test_port_has_the_spec_names(backend, name):
    pytest.importorskip("onnx" if backend == "export" else backend)
    if backend == "export" and name == "variants":
        pytest.skip("variants are Python overrides; the export refuses them by name")
    spec = importlib.import_module(f"ode_ref.{name}")
    port = importlib.import_module(f"{PORTS[backend]}.{name}")
    missing = public(spec) - public(port, own_only=False) - REPLACED.get((backend, name), set())
    assert not missing, f"backends.{backend}.{name} lacks {sorted(missing)}"


@pytest.mark.parametrize("backend", ["torch", "jax", "export"])
def test_stages_have_the_spec_names(backend):
    pytest.importorskip("onnx" if backend == "export" else backend)
    spec = importlib.import_module("ode_ref.attention").SelfAttention
    port = importlib.import_module(f"{PORTS[backend]}.attention").SelfAttention
    for stage in STAGES:
        assert callable(getattr(spec, stage)) and callable(getattr(port, stage)), stage
