"""The CPU a run is on, as the GEMM rule (torch/gemm.py) and the bench's records name it."""

from __future__ import annotations

import functools
import platform

VENDORS = ("GenuineIntel", "AuthenticAMD", "HygonGenuine")


@functools.lru_cache(maxsize=1)
def cpu_info() -> dict:
    """{"vendor": "GenuineIntel" | "AuthenticAMD" | ... | "", "model": its name, "isa": the widest
    x86 vector extension, "AVX-512", "AVX2" or "" (Arm and others)}: Linux's /proc/cpuinfo, else
    what platform.processor() says (Windows names the vendor there)."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if not sep:
                    if fields:
                        break  # the first processor's block is enough
                    continue
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    processor = platform.processor()
    vendor = fields.get("vendor_id") or next((v for v in VENDORS if v in processor), "")
    flags = fields.get("flags", "").split()
    isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else ""
    return {"vendor": vendor, "model": fields.get("model name", processor), "isa": isa}
