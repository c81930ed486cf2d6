"""The displayed precision of every number, in one place so tables, plots and tests agree."""
from __future__ import annotations

import math
from typing import Optional

MISSING = "—"


def _missing(value: Optional[float]) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def err(value: Optional[float]) -> str:
    """Relative error: three significant digits; bf16 errors span decades, so scientific notation."""
    return MISSING if _missing(value) else f"{value:.2e}"


def us(value: Optional[float]) -> str:
    """Latency in microseconds; 0.1 µs is below the CUDA-event resolution worth reading."""
    return MISSING if _missing(value) else f"{value:.1f}"


def seconds(value: Optional[float]) -> str:
    """Host-side durations (compile time): a tenth of a second."""
    return MISSING if _missing(value) else f"{value:.1f}"


def mib(nbytes: Optional[float]) -> str:
    """Bytes as MiB, one decimal: a step's peak memory."""
    return MISSING if _missing(nbytes) else f"{nbytes / 2 ** 20:.1f}"
BEAT_FLOOR = "beat floor"


def floor_pct(fraction: Optional[float]) -> str:
    """floor_us / measured_us as a percentage: 100% means the kernel runs at its floor. Above 1 (a file
    whose floors were not checked against its rows, the copy-bandwidth floors) the floor was no floor:
    no percentage is shown for it."""
    if _missing(fraction):
        return MISSING
    return BEAT_FLOOR if fraction > 1 else f"{fraction * 100:.0f}%"


def ratio(value: Optional[float]) -> str:
    return MISSING if _missing(value) else f"{value:.2f}x"


def bandwidth(gbps: Optional[float]) -> str:
    return "not measured" if _missing(gbps) else f"{gbps:.0f} GB/s"


def rate(gbps: Optional[float], nbytes: Optional[int], kernel: Optional[str]) -> str:
    """A measured bandwidth with the kernel that reached it and the bytes it moved."""
    if _missing(gbps):
        return "not measured"
    detail = ", ".join(part for part in (kernel, f"{nbytes / (1 << 20):.0f} MiB" if nbytes else None) if part)
    return f"{gbps:.0f} GB/s" + (f" ({detail})" if detail else "")


def tri(value: Optional[bool]) -> str:
    """A verdict that may not apply: yes / no / n.a."""
    return "n.a." if value is None else ("yes" if value else "no")
