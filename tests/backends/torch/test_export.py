"""The torch port through torch.export: the Core ATen opset, with batch and sequence dynamic, as
ExecuTorch and AOTInductor take it (litert-torch runs torch.export itself, at fixed shapes)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import ode_ref as R  # noqa: E402
from odeattn.backends.torch import ODEAttentionBlock  # noqa: E402
from odeattn.conformance.cases.tolerance import relative_error, tolerance  # noqa: E402

# the operators' variety at one Euler step (export traces every evaluation of f; 2 s a config): the
# rarer norms (erf, tanh, the sequence statistic) and encodings (the learnable BAM with SSMax,
# PaPE's content bias, HoPE, RoPE, ALiBi), BitLinear, the gate's two stages, both modes. Every
# encoding and norm, each once, exported to core operators alike when this test was written.
CONFIGS = [dict(norm_type="derf", ode_use_pe=True, positional_encoding="bam", bam_learn_mu=True, use_ssmax=True,
                mode="decoder", use_bitnet=True),
           dict(norm_type="dynamic_tanh", ode_use_pe=True, positional_encoding="pape", ode_solver="rk2_gated", ode_steps=1),
           dict(norm_type="flash_norm", ode_use_pe=True, positional_encoding="hope", mode="decoder"),
           dict(norm_type="prms_norm", ode_use_pe=True, positional_encoding="rope"),
           dict(norm_type="rms_norm", ode_use_pe=True, positional_encoding="alibi")]
# export's own runtime checks of a tensor's dtype and device, which every Core ATen consumer drops
ASSERTIONS = {"aten._assert_tensor_metadata.default"}
# the size arithmetic of a dynamic shape (Python's operators on symbolic ints), not tensor operators
SIZE_ARITHMETIC = {"<built-in function mul>", "<built-in function add>", "<built-in function sub>",
                   "<built-in function floordiv>", "<built-in function getitem>"}


def test_the_block_exports_to_core_aten_with_dynamic_batch_and_sequence():
    """torch.export with batch and sequence as Dims, then the default decompositions: every operator
    left is tagged core (no exp2, no nan_to_num) but export's own assertions, and the program run
    at another batch and sequence than the one traced is the spec's within the float32
    tolerance of its own error (tolerance.py)."""
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    rng = np.random.default_rng(0)
    for fields in CONFIGS:
        cfg = R.ODEConfig(hidden_size=16, num_heads=2, **{"ode_solver": "euler", "ode_steps": 1, **fields})
        params = R.init_params(cfg, seed=1, perturb_norms=True)
        block = ODEAttentionBlock.from_params(cfg, params)
        traced_mask = torch.ones(2, 8, dtype=torch.bool)
        program = torch.export.export(block, (torch.zeros(2, 8, 16),), {"padding_mask": traced_mask},
                                      dynamic_shapes={"x": {0: batch, 1: seq}, "padding_mask": {0: batch, 1: seq}})
        program = program.run_decompositions()
        targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"
                   and not (hasattr(n.target, "tags") and torch.Tag.core in n.target.tags)}
        assert targets <= ASSERTIONS | SIZE_ARITHMETIC, (fields, targets)  # a higher-order operator (no tags) fails too
        x = rng.normal(size=(3, 11, 16))
        mask = np.ones((3, 11), bool)
        mask[0, :4] = mask[2, 7:] = False
        got = program.module()(torch.as_tensor(x, dtype=torch.float32), padding_mask=torch.as_tensor(mask)).detach().numpy()
        want = R.ode_block(params, x, cfg, mask)
        e32 = relative_error(R.ode_block(params, x.astype(np.float32), cfg, mask), want)
        assert relative_error(got, want) <= tolerance(e32, "float32"), fields
