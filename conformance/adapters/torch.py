"""The PyTorch port (odeattn.backends.torch) as a backend: its modules in evaluation mode, in
float32, float64 and the half-precision rows."""

from __future__ import annotations

from typing import Optional

import numpy as np

import ode_ref as R
from ode_ref.config import dtype_name
from ode_ref.precision import DTYPES, HALF_DTYPES
from ode_ref.recording import recording

from ..cases import decode_loop
from ..cases.half import numpy_dtype


class TorchAdapter:
    name = "torch"
    # Every dtype of ode_ref.precision, the half ones included: its run_* methods take and return
    # arrays of the case's dtype (NumPy float16, ml_dtypes.bfloat16 for the half ones).
    dtypes = DTYPES

    def __init__(self):
        import torch

        from odeattn.backends import torch as port

        self.torch, self.port = torch, port

    def supports(self, config, dtype) -> Optional[str]:
        return None

    def _module(self, module):
        """A module as this backend runs it: the port's own (its GEMM by the rule, gemm.py)."""
        return module

    def _block(self, config, params, dtype, **kw):
        return self._module(self.port.ODEAttentionBlock.from_params(config, params, dtype=getattr(self.torch, dtype), **kw))

    def _tensors(self, x, padding_mask):
        """x (NumPy, in the row's dtype) as a tensor of that dtype: a bfloat16 array through float32,
        which holds it exactly (torch reads no NumPy bfloat16); the mask as a bool tensor."""
        t = self.torch
        xt = t.from_numpy(np.ascontiguousarray(self.port.params.readable(x)))
        half = dtype_name(x.dtype) in HALF_DTYPES
        return xt.to(getattr(t, dtype_name(x.dtype))) if half else xt, None if padding_mask is None else t.from_numpy(padding_mask)

    def _array(self, a, dtype):
        """A tensor back as NumPy in the row's dtype (a half one through float32, exactly)."""
        return a.float().numpy().astype(numpy_dtype(dtype)) if dtype in HALF_DTYPES else a.numpy()

    def run_trajectory(self, config, params, x, padding_mask, dtype):
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            return self._array(self._block(config, params, dtype)(x, padding_mask=mask, return_trajectory=True)[1], dtype)

    def run_block(self, config, params, x, padding_mask, dtype):
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            return self._array(self._block(config, params, dtype)(x, padding_mask=mask), dtype)

    def run_func(self, config, params, t, x, padding_mask, dtype):
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            return self._array(self._block(config, params, dtype).ode_func(t, x, padding_mask=mask), dtype)

    def run_decode(self, config, params, x, padding_mask, prompt, dtype):
        block = self._block(config, params, dtype)
        x, mask = self._tensors(x, padding_mask)

        def numpy_z(step):  # decode_loop collects z as NumPy
            return lambda *args, **kw: (lambda z, cache: (self._array(z, dtype), cache))(*step(*args, **kw))

        with self.torch.no_grad():
            return decode_loop(numpy_z(lambda x, m, n: block.prefill(x, m, max_len=n)), numpy_z(block.decode_step),
                               x, mask, prompt)

    def run_vjp(self, config, params, x, padding_mask, z1_bar, dtype):
        """Autograd through the block (BitLinear: the port's straight-through estimator)."""
        block = self._block(config, params, dtype)
        x, mask = self._tensors(x, padding_mask)
        x.requires_grad_(True)
        z = block(x, padding_mask=mask)
        z.backward(self._tensors(z1_bar, None)[0])
        inner = "ode_func." + R.params.POS_PREFIX  # the shared encoder's first name: the spec's is pos_encoder.X
        return self._array(x.grad, dtype), {name.removeprefix("ode_func.") if name.startswith(inner) else name:
                                            self._array(p.grad, dtype) for name, p in block.named_parameters()}

    def run_encoder(self, config, params, x, padding_mask, dtype):
        """The ODEEncoder module in evaluation mode, the case's parameters loaded strict."""
        torch = self.torch
        encoder = self.port.ODEEncoder.from_params(config, params, dtype=getattr(torch, dtype))
        with torch.no_grad():
            mask = None if padding_mask is None else torch.from_numpy(padding_mask)
            return encoder(torch.from_numpy(np.ascontiguousarray(x)), mask).numpy()

    def run_lm(self, config, params, ids, attention_mask, dtype):
        """The ODELanguageModel module in evaluation mode, the case's parameters loaded strict."""
        torch = self.torch
        model = self._module(self.port.ODELanguageModel.from_params(config, params, dtype=getattr(torch, dtype)))
        with torch.no_grad():
            mask = None if attention_mask is None else torch.from_numpy(attention_mask)
            return model(torch.from_numpy(ids), mask).numpy()

    def run_stages(self, config, params, x, padding_mask, dtype):
        """f(0, x)'s stage values (cases/stages.py): the port's SelfAttention, recording."""
        from odeattn.backends.torch.attention import SelfAttention

        attention = recording(SelfAttention)(config)
        x, mask = self._tensors(x, padding_mask)
        with self.torch.no_grad():
            block = self._block(config, params, dtype, ode_func=attention)
            block.ode_func(0.0, x, padding_mask=mask)
        return {k: self._array(v, dtype) for k, v in type(attention).store.items()}


class TorchOneDnnAdapter(TorchAdapter):
    """The torch port with its projections through oneDNN, as the rule runs them on AMD CPUs with
    AVX-512 (backends/torch/gemm.py): proven on any machine whose torch has oneDNN. float32 alone,
    the one dtype the rule touches; its gradient rows run torch's matmul, as training does."""

    name = "torch-onednn"
    dtypes = ("float32",)

    def supports(self, config, dtype) -> Optional[str]:
        from odeattn.backends.torch.gemm import onednn_usable

        return None if onednn_usable() else "oneDNN is absent or disabled in this torch (torch.backends.mkldnn)"

    def _module(self, module):
        from odeattn.backends.torch.gemm import attentions, use_gemm

        # a language model of encoder layers holds no block attention: it runs as the torch backend's
        return use_gemm(module, "onednn") if attentions(module) else module
