"""What machine this is, for records whose numbers depend on it: the CPU model and the vector
extensions that change which kernels run (AVX2 only, AVX-512, native bf16, AMX). Two machines of
one kind may differ here (AMD EPYC with AVX2, Intel Xeon with AVX-512-BF16 and AMX), and with
them every speed, and in bf16 even some outputs."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

# the extensions that decide the fp32 / bf16 kernels, in /proc/cpuinfo's spelling
FEATURES = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


@functools.cache
def _cpuinfo() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (read once per process); {} elsewhere."""
    info = Path("/proc/cpuinfo")
    fields: dict[str, str] = {}
    if info.is_file():
        for line in info.read_text().splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    return fields


def processor_name() -> str:
    """The CPU model, e.g. 'AMD EPYC 7B13' (platform's name where /proc/cpuinfo is missing)."""
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def processor_features() -> list[str]:
    """Which of FEATURES this CPU has."""
    flags = set(_cpuinfo().get("flags", "").split())
    return [f for f in FEATURES if f in flags]


def describe() -> str:
    """'<model> (<features>)', the line records keep about the machine that made them."""
    features = processor_features()
    return f"{processor_name()} ({', '.join(features) if features else 'no ' + FEATURES[0]})"


@functools.cache
def last_level_cache_bytes(default: int = 32 << 20) -> int:
    """The largest CPU cache of one core's view (Linux sysfs, e.g. a 32 MiB L3); `default`
    where the system does not say."""
    sizes = []
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            sizes.append(int(text.rstrip("KMG")) * unit)
        except ValueError:
            continue
    return max(sizes, default=default)
