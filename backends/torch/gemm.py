"""Which float32 GEMM the torch port's two projections run through in inference.

torch's own matmul (`x @ w.T`, MKL on x86) is the fastest float32 GEMM on Intel CPUs, but on AMD
ones MKL runs at under half of what oneDNN reaches on the same machine (Performance: "The float32
GEMM"). So, in inference only, a float32 module on the CPU runs its projections through oneDNN
with its weights packed once into oneDNN's blocked layout; training, gradients, torch.compile,
other dtypes and devices, BitLinear, and builds without oneDNN keep torch's matmul. Which one runs
is a documented rule, not a probe timed at load, so that two runs on one machine give the same
bits: GEMMS names the choices, and `use_gemm(module, name)` overrides the rule for a module.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..cpu import cpu_info

GEMMS = ("auto", "torch", "onednn")  # auto: the rule below (default_gemm)
NOT_INTEL_X86 = ("AuthenticAMD", "HygonGenuine")  # the vendors MKL does not give its fast kernels


def cpu_vendor() -> str:
    return cpu_info()["vendor"]


def default_gemm() -> str:
    """The rule: oneDNN on x86 CPUs of a vendor other than Intel, where torch was built with it;
    torch's own matmul everywhere else (Intel, where MKL measures as fast as oneDNN, and Arm)."""
    return "onednn" if cpu_vendor() in NOT_INTEL_X86 and torch.backends.mkldnn.is_available() else "torch"


def check_gemm(name) -> str:
    """name if it is one of GEMMS; a ValueError naming the field otherwise."""
    if name not in GEMMS:
        raise ValueError(f"gemm: expected one of {', '.join(GEMMS)}; got {name!r}")
    if name == "onednn" and not torch.backends.mkldnn.is_available():
        raise ValueError("gemm: 'onednn' needs a torch built with oneDNN (torch.backends.mkldnn.is_available() "
                         "is False here); got 'onednn'")
    return name


def use_gemm(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Sets the GEMM of every self-attention in module ("auto": the rule); returns module."""
    check_gemm(name)
    for m in module.modules():
        if isinstance(getattr(m, "_packed", None), PackCache):  # attention.SelfAttention and its variants
            m.gemm = name
    return module


class Packed(NamedTuple):
    """A weight packed for oneDNN: what linear takes in place of the (out, in) weight."""

    packed: torch.Tensor


class PackCache:
    """A module's packed weights by name, packed again only when the parameter was replaced or
    written in place (load_state_dict, an optimiser step) since: its storage and version differ."""

    def __init__(self):
        self._packed: dict[str, tuple[tuple, Packed]] = {}

    def __call__(self, name: str, w: torch.Tensor) -> Packed:
        key = (w.data_ptr(), w._version, tuple(w.shape))
        got = self._packed.get(name)
        if got is None or got[0] != key:
            got = self._packed[name] = (key, Packed(torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)))
        return got[1]


def runs_onednn(gemm: str, w: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether a projection of x by w runs through oneDNN: the module's choice (auto: the rule),
    in inference (no gradient asked of w or x), float32 on the CPU. Called in eager mode alone:
    torch.compile chooses its own GEMMs (and traces no file read, the rule's)."""
    choice = default_gemm() if check_gemm(gemm) == "auto" else gemm
    return (choice == "onednn" and w.dtype == torch.float32 and w.device.type == "cpu" and x.dtype == torch.float32
            and not (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad)))


def onednn_linear(x: torch.Tensor, w: Packed) -> torch.Tensor:
    """x @ W.T through oneDNN, W packed (bitlinear.linear calls it for a Packed weight)."""
    return torch.ops.mkldnn._linear_pointwise(x, w.packed, None, "none", [], "")
