"""Each port mirrors the spec file by file and function by function.

A port whose stages are the spec's (its SelfAttention subclasses ode_ref's, INHERITS) writes only
what differs in its framework: every stage it overrides and every spec function it writes again
is listed in OVERRIDES with the reason, keeps the spec's parameters, and is still overridden. The
other ports write the spec's public functions, classes and stages under the same names, with the
same parameters in the same order, except for the short list of deliberate differences below,
each with its reason."""

import importlib
import inspect

import pytest

import ode_ref as R

MODULES = ["norms", "bitlinear", "positions", "attention", "variants"]
PORTS = {"torch": "odeattn.backends.torch", "jax": "odeattn.backends.jax", "export": "odeattn.export"}
# Ports whose SelfAttention subclasses the spec's: the modules in which they write only what differs.
INHERITS = {"jax": ("attention", "positions"), "torch": ("attention", "positions")}
# Spec modules a port holds in its package, not in a file of its own: the variants, which
# ode_ref.variants.port_variants ports into the package under their names.
IN_PACKAGE = {("jax", "variants"), ("torch", "variants")}
_FLOAT64 = "JAX has no float64 at run time (x64 off): gathers rows of the spec's float64 table, made at trace time"
_OWNED = "the module owns its parameters: prepare(x, padding_mask), the weights its own"
_TORCH64 = "float64 in torch ops on the positions' device (the spec's in NumPy)"
_DTYPE = "JAX has no float64 at run time (x64 off): computed in the state's dtype (float64 under x64)"
# (port, stage) of its SelfAttention, or (port, module, function): why the port writes it again.
OVERRIDES = {
    ("jax", "xp"): "the port's array namespace, jax.numpy",
    ("jax", "attention", "SelfAttention"): "the spec's class over jax.numpy, its overrides these",
    ("jax", "quantize_weight"): "the straight-through estimator: a custom_jvp whose derivative is the identity",
    ("jax", "_linear"): "the straight-through BitLinear (quantize_weight's custom_jvp)",
    ("jax", "norm"): "the JAX norms: pow2_scale from the exponent bits, under stop_gradient, jax.scipy's erf",
    ("jax", "rope_tables"): _FLOAT64, ("jax", "hope_tables"): _FLOAT64,
    ("jax", "bam_bias"): _DTYPE, ("jax", "ssmax_factor"): _DTYPE,
    **{("jax", stage): "functional updates at a slot index that may be traced (lax.dynamic_slice)"
       for stage in ("pad_slots", "write_slot", "read_slot", "mark_slot")},
    ("jax", "integrate"): "with a cache hook, a lax.scan over the evaluations (rk.integrate): one evaluation of f in the program",
    ("jax", "hide_nonfinite"): "the poisoned queries as a product of the mask with the bad keys: no (seq_q, seq_k, heads) array",
    ("jax", "attn"): "the scores a tile of heads at a time (tiled, SCORE_TILE_BYTES)",
    ("jax", "attention", "softmax"): "the max under stop_gradient: differentiated, it needs an entry equal to a max XLA rounds anew",
    ("jax", "positions", "rope_cos_sin"): _FLOAT64 + "; needs the static bound",
    ("jax", "positions", "hope_tables"): _FLOAT64 + "; needs the static bound",
    ("jax", "positions", "bam_bias"): _DTYPE, ("jax", "positions", "bam_alpha_beta"): _DTYPE,
    ("jax", "positions", "bam_mu"): _DTYPE + ": theta_mu itself when learnable",
    ("jax", "positions", "ssmax_factor"): "the ln in float32 at least, float64 under x64",
    # torch: the module owns its parameters, SDPA and its mask forms, float64 in torch ops
    ("torch", "xp"): "torch under NumPy's names, on the module's device (backends/torch/xp.py)",
    ("torch", "attention", "SelfAttention"): "the seed's ODEFunc(config, pos_encoder=None); the config decides the encoding",
    ("torch", "__call__"): "nn.Module's: forward(t, x), the seed's",
    ("torch", "prepare"): _OWNED, ("torch", "weights"): _OWNED, ("torch", "encoder_weights"): _OWNED,
    ("torch", "gate_weights"): "the gate is the block's module: None when f is evaluated alone",
    ("torch", "norm"): "the nn.Module self.norm (the seed's name), whose forward(norm_params, x) is the stage",
    ("torch", "quantize_weight"): "the straight-through estimator (an autograd identity)",
    ("torch", "_linear"): "the straight-through BitLinear (bitlinear.py)",
    ("torch", "build_mask"): "None when every key is visible, Causal kept symbolic: SDPA's is_causal, no (seq, seq) tensor",
    ("torch", "hide_keys"): "builds Causal's tensor before narrowing it",
    ("torch", "merge_bias"): "SDPA takes one mask: the bias merged into an additive float mask, once per forward",
    ("torch", "attn"): "torch's scaled_dot_product_attention (fused kernels); the additive mask written out",
    ("torch", "hide_nonfinite"): "by the mask's own form (Causal: a cumulative any), skipped when every value is finite",
    ("torch", "poison_queries"): "masked_fill keeps q's layout (SDPA's rounding follows it); None when nothing is poisoned",
    ("torch", "rope_tables"): _TORCH64, ("torch", "hope_tables"): _TORCH64, ("torch", "bam_bias"): _TORCH64,
    ("torch", "ssmax_factor"): _TORCH64,
    **{("torch", stage): "out of place on the device: cat and slice_scatter (the cache given is never written)"
       for stage in ("pad_slots", "write_slot", "mark_slot")},
    **{("torch", "positions", name): _TORCH64 for name in (
        "rope_cos_sin", "hope_angles", "hope_damping", "hope_tables", "bam_alpha_beta", "bam_mu", "bam_bias", "ssmax_factor")},
}
# Signatures an override changes deliberately: (port, module, name) -> why.
OVERRIDE_SIGNATURES = {
    ("torch", "prepare"): _OWNED, ("torch", "__call__"): "nn.Module's: forward(t, x), the seed's",
    ("torch", "norm"): "a submodule, whose forward(norm_params, x) is the stage",
    ("jax", "positions", "rope_cos_sin"): "the static bound of the table: (positions, config, dtype, bound)",
    ("jax", "positions", "hope_tables"): "the static bound of the table: (positions, config, layer_idx, dtype, bound)",
}
# Written once in the spec and run by every port, so no port defines its own.
SHARED = {("attention", "Stages"), ("attention", "Prepared"), ("attention", "of_the_spec")}
# Spec names a port does without, and why.
REPLACED = {
    ("torch", "norms", "erf"): "torch.erf",
    ("export", "attention", "sigmoid"): "the Sigmoid node",
    ("jax", "norms", "erf"): "jax.scipy.special.erf",
    ("export", "norms", "erf"): "the Erf node",
    ("export", "norms", "Norms"): "each norm built of ONNX nodes, no array namespace (export/norms.py)",
    ("export", "bitlinear", "weight_scale"): "done at export time by the spec's ternarize_weight",
    ("export", "bitlinear", "ternarize_weight"): "done at export time by the spec's own function",
    ("export", "variants", "*"): "a variant exports through block.export_attention, which ports the spec's class (port_variant)",
    **{(port, "variants", name): "the spec's own check, run by the ported class's __init__"
       for port in ("torch", "jax") for name in ("check_window", "check_factor", "port_variant", "port_variants")},
    **{(port, "positions", name): "the spec's float64 constants, imported by the port"
       for port in ("export",) for name in ("rope_frequencies", "rope_angles", "alibi_slopes")},
    **{(port, "positions", name): "the spec's float64 constants, imported by the port"
       for port in ("export",) for name in ("rotary_frequencies", "rotary_base_scaling", "hope_gain")},
    **{(port, "positions", "seed_sinusoidal_table"): "the seed's float32 table: documents and tests the spec, no path runs it"
       for port in ("export",)},
}
# Stages whose signature deliberately differs, in every SelfAttention class of a port.
DIFFERENT_STAGES = {("torch", "prepare"): "the module owns its parameters: prepare(x, padding_mask)"}
# Stages a port holds otherwise, in every SelfAttention class of it.
REPLACED_STAGES = {
    ("torch", "norm"): "the nn.Module self.norm (the seed's name), whose forward(norm_params, x) is the stage",
}
# Signatures that deliberately differ: (port, module, name) -> why.
DIFFERENT = {
    **{("torch", "variants", v.__name__): "inherits the seed's ODEFunc(config, pos_encoder=None)"
       for v in R.VARIANTS if "__init__" not in vars(v)},
    ("export", "positions", "rope_cos_sin"): "always float32 in the graph: (positions, config)",
    ("export", "attention", "SelfAttention"): "the graph's opset: SelfAttention(config, opset)",
    ("export", "attention", "masked_fill_min"): "builds nodes in a graph body: (g, s, mask)",
    ("export", "attention", "softmax"): "builds nodes in a graph body: (g, s)",
    ("export", "bitlinear", "quantize_weight"): "dequantises ternary values quantised at export: (ternary_t, scale)",
    ("export", "bitlinear", "quantize_activation"): "the width is static in the graph: (x, *, width)",
    ("export", "bitlinear", "bitlinear"): "the width is static in the graph: (x, w_q_t, *, width)",
    ("export", "bitlinear", "linear"): "takes W transposed: (x, w_t)",
    ("export", "norms", "apply_norm"): "the width is static in the graph: (..., *, width)",
    ("export", "norms", "prms_norm"): "the width is static in the graph",
    ("export", "norms", "dynamic_tanh"): "the width is static in the graph",
}

# The seed's positional family (ode_ref/positions.py) in the JAX port and the export.
REPLACED.update({
    **{("export", "positions", name): "double nodes inside hope_tables" for name in ("hope_angles", "hope_damping")},
    ("export", "positions", "bam_mu"): "the spec's constant (theta_mu itself when learnable)",
    ("export", "positions", "alibi_bias"): "the spec's own over the graph's XP (export.attention's stage)",
})
DIFFERENT.update({
    ("export", "positions", "hope_tables"): "always float32 in the graph: (positions, config, layer_idx)",
    ("export", "positions", "distances"): "always float32 in the graph: (positions_q, positions_k)",
    ("export", "positions", "pape_coefficients"): "takes ab.weight transposed, as every stored projection: ab_t",
    ("export", "positions", "bam_bias"): "always float32 in the graph: (encoder, positions_q, positions_k, config)",
    ("export", "positions", "ssmax_factor"): "always float32 in the graph: (s, lengths)",
})


# The norms' formulas are the spec's Norms over a port's namespace: what a port's Norms writes again, and why.
NORM_OVERRIDES = {
    ("jax", "pow2_scale"): "the spec's s from the exponent bits (frexp and ldexp: half again as many traced operations), under stop_gradient",
    ("jax", "erf"): "jax.scipy's erf (the spec's: libm's per element, in NumPy)",
    ("torch", "pow2_scale"): "log2 and pow(2, e) rather than frexp (torch.onnx.export cannot translate it) or exp2 (outside the Core ATen opset)",
    ("torch", "layer_norm"): "torch.native_layer_norm in eager mode, the spec's formula for the tokens it fails",
    ("torch", "rms_norm"): "aten._fused_rms_norm in eager mode, the spec's formula for the tokens it fails",
    ("torch", "erf"): "torch.erf (the spec's: libm's per element, in NumPy)",
}


@pytest.mark.parametrize("port", ["jax", "torch"])
def test_a_port_s_norms_are_the_spec_s_but_what_it_says_why(port):
    pytest.importorskip(port)
    cls = importlib.import_module(f"{PORTS[port]}.norms").Norms
    assert issubclass(cls, R.norms.Norms) and cls.xp is not R.norms.Norms.xp, port
    written = {(port, n) for klass in cls.__mro__[:cls.__mro__.index(R.norms.Norms)] for n in vars(klass)
               if n in vars(R.norms.Norms) and not n.startswith("__") and n != "xp"}
    assert written == {k for k in NORM_OVERRIDES if k[0] == port}
    for _, name in written:
        assert parameters(getattr(R.norms.Norms, name)) == parameters(getattr(cls, name)), name


def own_public(module) -> dict:
    return {n: v for n, v in vars(module).items()
            if not n.startswith("_") and callable(v) and getattr(v, "__module__", None) == module.__name__}


def parameters(obj) -> list:
    """Parameter names in order (self dropped), of a function or a class's __init__; the spec's
    trailing xp (the array namespace its shared functions take) dropped too: a port that writes a
    function again writes it in its own arrays."""
    fn = obj.__init__ if inspect.isclass(obj) else obj
    if not callable(fn):  # an attribute (torch's norm: a property holding the submodule)
        return None
    return [p for p in inspect.signature(fn).parameters if p not in ("self", "xp")]


def port_module(port: str, module: str):
    """The port's module that mirrors ode_ref.<module>: the port's package itself for IN_PACKAGE."""
    return importlib.import_module(PORTS[port] if (port, module) in IN_PACKAGE else f"{PORTS[port]}.{module}")


def pairs(port: str, module: str):
    """(qualified name, spec object, port object or None) for everything the port must mirror."""
    if (port, module, "*") in REPLACED or module in INHERITS.get(port, ()):
        return
    spec = importlib.import_module(f"ode_ref.{module}")
    mirror = port_module(port, module)
    for name, obj in own_public(spec).items():
        if (module, name) in SHARED or (port, module, name) in REPLACED or name.endswith("_vjp"):
            continue  # a *_vjp is the spec's hand-written backward pass: a port differentiates itself
        yield name, obj, getattr(mirror, name, None)
        if inspect.isclass(obj) and getattr(mirror, name, None) is not None:
            for stage in dir(obj):  # its stages, those from Stages included
                fn = getattr(obj, stage)
                if callable(fn) and not stage.startswith("_") and not inspect.isclass(fn) \
                        and (port, stage) not in REPLACED_STAGES:
                    yield f"{name}.{stage}", fn, getattr(getattr(mirror, name), stage, None)


@pytest.mark.parametrize("port", list(PORTS))
@pytest.mark.parametrize("module", MODULES)
def test_port_mirrors_names_and_signatures(port, module):
    pytest.importorskip("onnx" if port == "export" else port)
    missing, differing = [], []
    for name, spec_obj, port_obj in pairs(port, module):
        if port_obj is None:
            missing.append(name)
        elif (port, module, name) not in DIFFERENT and (port, name.rpartition(".")[2]) not in DIFFERENT_STAGES \
                and parameters(spec_obj) != parameters(port_obj):
            differing.append(f"{name}: spec {parameters(spec_obj)}, port {parameters(port_obj)}")
    assert not missing, f"{PORTS[port]}.{module} lacks {missing}"
    assert not differing, differing


def spec_class_members(cls) -> set:
    """The stages and helpers of the spec's class, private ones (_linear) included, and __call__
    (the spec's evaluate); no other dunder."""
    return {n for n in dir(cls) if not n.startswith("__")} | {"__call__"}


@pytest.mark.parametrize("port", list(INHERITS))
def test_an_inheriting_port_overrides_only_what_it_says_why(port):
    """Its SelfAttention is the spec's over the port's namespace: each stage it writes again, and
    each spec function its modules write again, is in OVERRIDES, with the spec's parameters unless
    OVERRIDE_SIGNATURES says why; and each listed override still exists."""
    pytest.importorskip(port)
    spec_cls = R.SelfAttention
    cls = importlib.import_module(f"{PORTS[port]}.attention").SelfAttention
    assert issubclass(cls, spec_cls) and cls.xp is not spec_cls.xp, port
    own = {n for klass in cls.__mro__[:cls.__mro__.index(spec_cls)] for n in vars(klass)} & spec_class_members(spec_cls)
    written = {(port, n) for n in own}
    for module in INHERITS[port]:
        spec_module = importlib.import_module(f"ode_ref.{module}")
        mine = own_public(importlib.import_module(f"{PORTS[port]}.{module}"))
        written |= {(port, module, n) for n in mine if n in own_public(spec_module)}
    listed = {k for k in OVERRIDES if k[0] == port}
    assert not written - listed, f"overridden without a reason in OVERRIDES: {sorted(written - listed)}"
    assert not listed - written, f"listed in OVERRIDES but no longer overridden: {sorted(listed - written)}"
    for key in written:
        spec_obj, port_obj = spec_and_port(key)
        if callable(spec_obj) and not inspect.isclass(spec_obj) and not inspect.ismodule(spec_obj) \
                and key not in OVERRIDE_SIGNATURES:
            assert parameters(spec_obj) == parameters(port_obj), (key, parameters(spec_obj), parameters(port_obj))
    for key in (k for k in OVERRIDE_SIGNATURES if k[0] == port):
        spec_obj, port_obj = spec_and_port(key)
        assert parameters(spec_obj) != parameters(port_obj), f"{key} now matches: drop it from OVERRIDE_SIGNATURES"


def spec_and_port(key):
    """(the spec's object, the port's) of an OVERRIDES key: (port, stage) or (port, module, name)."""
    if len(key) == 2:
        port, stage = key
        return getattr(R.SelfAttention, stage), getattr(importlib.import_module(f"{PORTS[port]}.attention").SelfAttention, stage)
    port, module, name = key
    return (getattr(importlib.import_module(f"ode_ref.{module}"), name),
            getattr(importlib.import_module(f"{PORTS[port]}.{module}"), name))


def test_every_listed_difference_still_exists():
    """A difference that was mended leaves its list (no stale excuses)."""
    for port, module, name in REPLACED:
        if name == "*" or importlib.util.find_spec("onnx" if port == "export" else port) is None:
            continue
        assert name not in own_public(port_module(port, module)), f"{port}.{module}.{name} exists now"
    for (port, stage), lists in ((k, "DIFFERENT_STAGES") for k in DIFFERENT_STAGES):
        spec = getattr(importlib.import_module("ode_ref.attention").SelfAttention, stage)
        mine = getattr(importlib.import_module(f"{PORTS[port]}.attention").SelfAttention, stage)
        assert parameters(spec) != parameters(mine), f"{port} {stage} now matches: drop it from {lists}"
    for port, stage in REPLACED_STAGES:
        assert not callable(vars(importlib.import_module(f"{PORTS[port]}.attention").SelfAttention).get(stage)), stage
    for port, module, name in DIFFERENT:
        if importlib.util.find_spec("onnx" if port == "export" else port) is None:
            continue
        found = {n: (s, p) for n, s, p in pairs(port, module)}
        assert name in found and found[name][1] is not None, (port, module, name)
        spec_obj, port_obj = found[name]
        assert parameters(spec_obj) != parameters(port_obj), f"{port}.{module}.{name} now matches: drop it from DIFFERENT"


def test_every_port_runs_the_spec_orchestration():
    """evaluate and prepare are the spec's Stages, not rewritten per port (torch wraps prepare to
    check its input and pass its own parameters)."""
    from ode_ref.attention import Stages

    for port in PORTS:
        if importlib.util.find_spec("onnx" if port == "export" else port) is None:
            continue
        cls = importlib.import_module(f"{PORTS[port]}.attention").SelfAttention
        assert issubclass(cls, Stages) and cls.evaluate is Stages.evaluate, port
        assert cls.prepare is Stages.prepare or port == "torch", port


# The Flax port keeps the staged attention API's names and signatures (odeattn.backends.flax):
# each of its stages is the spec's stage of the same name (project's inner half, _project_inner,
# is the API's own), and its ModuleStages hands each spec stage to it.
FLAX_STAGES = {"_project_inner": "project", "project": "project", "preprocess_qkv": "preprocess_qkv",
               "build_mask": "build_mask", "attn": "attn", "postprocess_attn": "postprocess_attn",
               "output_proj": "output_proj"}


def test_the_flax_port_names_the_spec_s_stages_and_variants():
    pytest.importorskip("flax")
    from odeattn.backends import flax as F
    from odeattn.backends import jax as J
    from odeattn.backends.flax.attention import ModuleStages

    for stage, spec_stage in FLAX_STAGES.items():
        assert callable(getattr(F.SelfAttention, stage)) and callable(getattr(R.SelfAttention, spec_stage)), stage
        assert spec_stage in vars(ModuleStages), spec_stage  # handed to the module
    assert sorted(F.variants.__all__) == sorted(v.__name__ for v in R.VARIANTS)
    for variant in R.VARIANTS:  # each is the spec's class ported over the JAX port, writing no stage of its own
        flax_variant = getattr(F, variant.__name__)
        assert flax_variant.stages is getattr(J, variant.__name__), variant.__name__
        assert not {s for s in FLAX_STAGES if s in vars(flax_variant)}, variant.__name__
        assert {s for s in vars(flax_variant.stages) if not s.startswith("__")} == \
            {s for s in vars(variant) if not s.startswith("__")}, variant.__name__
