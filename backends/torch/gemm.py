"""Which float32 GEMM the torch port's two projections run through in inference.

torch's own matmul (`x @ w.T`, MKL on x86) is as fast as any float32 GEMM on Intel CPUs and on
AMD ones without AVX-512, but on an AMD CPU with AVX-512 MKL runs its AVX2 kernels, at under half
of what oneDNN reaches on the same machine (Performance: "The float32 GEMM"). So on those CPUs
(AMD's and Hygon's, with AVX-512), in float32 inference on the CPU (no gradient recorded, no
autocast, eager mode), the port runs its projections through oneDNN with its weights packed into
oneDNN's blocked layout; everything else keeps torch's matmul. Which one runs is a documented
rule, not a probe timed at load, so that two runs on one machine give the same bits; GEMMS names
the choices, and `use_gemm(module, name)` sets one for a module.
"""

from __future__ import annotations

import torch

from ..cpu import cpu_info

GEMMS = ("auto", "torch", "onednn")  # auto: the rule (default_gemm)
MKL_AVX2_VENDORS = ("AuthenticAMD", "HygonGenuine")  # x86 vendors whose AVX-512 MKL leaves unused


def onednn_usable() -> bool:
    """Whether this torch has oneDNN and it is enabled (torch.backends.mkldnn.enabled)."""
    return torch.backends.mkldnn.is_available() and torch.backends.mkldnn.enabled


def default_gemm() -> str:
    """The rule: "onednn" on AMD and Hygon CPUs with AVX-512 where oneDNN is usable, "torch" on every
    other CPU (Intel's, AMD's without AVX-512, Arm)."""
    cpu = cpu_info()
    return "onednn" if cpu["vendor"] in MKL_AVX2_VENDORS and cpu["isa"] == "AVX-512" and onednn_usable() else "torch"


def check_gemm(name) -> str:
    """name if it is one of GEMMS (and "onednn" usable here); a ValueError naming the field otherwise."""
    if name not in GEMMS:
        raise ValueError(f"gemm: expected one of {', '.join(GEMMS)}; got {name!r}")
    if name == "onednn" and not onednn_usable():
        raise ValueError("gemm: expected 'auto' or 'torch' here, where oneDNN is absent or disabled "
                         "(torch.backends.mkldnn); got 'onednn'")
    return name


def use_gemm(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Sets the GEMM of every self-attention of the port in module and returns module: "auto" (the
    rule), "torch" (torch's matmul), or "onednn" (oneDNN with packed weights, for every float32
    forward on the CPU with no gradient recorded and no autocast, in eager mode; torch's matmul for
    the rest: gradients, other dtypes and devices, BitLinear, torch.compile)."""
    check_gemm(name)
    if not attentions(module):
        raise ValueError(f"module: expected one holding the port's SelfAttention; got {type(module).__name__}")
    for m in attentions(module):
        m.gemm = name
        m._packed.clear()
    return module


def attentions(module: torch.nn.Module) -> list:
    """The port's self-attentions in module (attention.SelfAttention and its variants)."""
    return [m for m in module.modules() if isinstance(getattr(m, "_packed", None), PackCache)]


def runs_onednn(gemm: str, w: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether the projections of x by w run through oneDNN now: the module's choice (auto: the
    rule), float32 on the CPU, no gradient recorded, no autocast. Asked in eager mode alone:
    torch.compile chooses its own GEMMs (and traces no file read, the rule's)."""
    if (check_gemm(gemm) == "torch" or torch.is_grad_enabled() or not w.dtype == x.dtype == torch.float32
            or w.device.type != "cpu" or torch.is_autocast_enabled("cpu")):  # the cheap conditions first
        return False
    return gemm == "onednn" or default_gemm() == "onednn"


def pack(w: torch.Tensor) -> torch.Tensor:
    """An (out, in) weight packed into oneDNN's blocked layout, for onednn_linear."""
    return torch.ops.mkldnn._reorder_linear_weight(w.detach(), None)


def onednn_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ W.T through oneDNN, W packed."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class PackCache:
    """A module's parameters packed for oneDNN. refresh, once per forward, compares each parameter
    with the copy it was packed from and packs it again where it differs, so any write is seen
    (load_state_dict, an optimiser's step, `.data`, a parameter replaced); lookup finds the packed
    form of a parameter refreshed. Neither copied nor saved with the module: a copy starts empty."""

    def __init__(self):
        self._entries: dict[str, tuple] = {}  # name -> (parameter, the copy packed, the packed weight)

    def refresh(self, **params: torch.Tensor) -> None:
        for name, w in params.items():
            entry = self._entries.get(name)
            if entry is None or entry[0] is not w or not torch.equal(entry[1], w):
                self._entries[name] = (w, w.detach().clone(), pack(w))

    def empty(self) -> bool:
        """Whether nothing is packed yet (the next forward on oneDNN packs every projection)."""
        return not self._entries

    def lookup(self, w: torch.Tensor):
        """The packed form of the parameter w, or None where w is not one refreshed."""
        return next((packed for p, _, packed in self._entries.values() if p is w), None)

    def clear(self) -> None:
        self._entries.clear()

    def __deepcopy__(self, memo) -> PackCache:
        return PackCache()

    def __getstate__(self) -> dict:
        return {"_entries": {}}
