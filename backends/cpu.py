"""The CPU a run is on, as the GEMM rule (torch/gemm.py) and the bench's records name it."""

from __future__ import annotations

import functools
import platform

VENDORS = ("GenuineIntel", "AuthenticAMD", "HygonGenuine")
FEATURES = ("avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile")  # what the matmuls of int8 and bfloat16 use


def parse_cpuinfo(text: str, processor: str = "") -> dict:
    """{"vendor": "GenuineIntel" | "AuthenticAMD" | ... | "", "model": its name, "isa": the widest
    x86 vector extension ("AVX-512", "AVX2" or "": Arm and others), "features": those of FEATURES
    it has} from /proc/cpuinfo's text (its first processor), else from processor, what
    platform.processor() says (Windows names the vendor there)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep and fields:
            break  # the end of the first processor's block
        if sep:
            fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    return {"vendor": fields.get("vendor_id") or next((v for v in VENDORS if v in processor), ""),
            "model": fields.get("model name", processor),
            "isa": "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "",
            "features": [f for f in FEATURES if f in flags]}


@functools.lru_cache(maxsize=1)
def _this_cpu() -> dict:
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
    except OSError:
        text = ""
    return parse_cpuinfo(text, platform.processor())


def cpu_info() -> dict:
    """This machine's parse_cpuinfo, read and parsed once (a fresh copy each call: the GEMM rule
    asks at every projection)."""
    info = _this_cpu()
    return {**info, "features": list(info["features"])}
