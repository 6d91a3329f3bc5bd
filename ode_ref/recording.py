"""The stages of f that a port reports by name, and a recorder of their values.

    STAGES       norm, q, k, v (after preprocess_qkv), attn (after postprocess_attn), output_proj
    recording    a subclass of a port's SelfAttention (any that mixes in ode_ref.attention.Stages)
                 that keeps each stage's first value

The conformance suite reads a port's stages of f(0, x) this way to name the first stage that
diverges (conformance/cases/stages.py), and the ONNX export the same way to add them to a
diagnostic graph as outputs (export.block.stage_outputs).
"""

from __future__ import annotations

STAGES = ("norm", "q", "k", "v", "attn", "output_proj")


def recording(base: type) -> type:
    """A subclass of a port's SelfAttention whose `store` (a class attribute, a dict) gets each
    stage's first value; make a fresh subclass per run."""
    def keep(self, name, a):
        type(self).store.setdefault(name, a)
        return a

    def project(self, w_qkv, h):  # h is the norm's output (torch's norm is a module: its input is read here)
        return base.project(self, w_qkv, keep(self, "norm", h))

    def preprocess_qkv(self, q, k, v, **kw):
        out = base.preprocess_qkv(self, q, k, v, **kw)
        return tuple(keep(self, n, a) for n, a in zip("qkv", out))

    def postprocess_attn(self, y, padding_mask=None):
        return keep(self, "attn", base.postprocess_attn(self, y, padding_mask))

    def output_proj(self, w_out, y):
        return keep(self, "output_proj", base.output_proj(self, w_out, y))

    return type(f"Recording{base.__name__}", (base,), {"store": {}, "keep": keep, "project": project, "preprocess_qkv": preprocess_qkv,
                                                       "postprocess_attn": postprocess_attn, "output_proj": output_proj})
