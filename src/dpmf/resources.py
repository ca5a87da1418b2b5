"""Machine resources (bottom layer, next to :mod:`dpmf.errors`): the memory available now, and a
check that refuses a dense allocation that cannot fit with a :class:`~dpmf.errors.DPMFError`
instead of numpy's ``MemoryError`` (or the machine swapping to a halt)."""

from __future__ import annotations

import math
import os

from dpmf.errors import InvalidParameterError

__all__ = ["available_memory", "check_allocation", "format_bytes", "format_seconds"]

_GIB = 2.0**30


def available_memory() -> float:
    """Bytes of memory available to a new allocation (``MemAvailable`` of ``/proc/meminfo``;
    otherwise the physical memory; ``inf`` when unknown)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - exotic platforms
        return math.inf


def format_bytes(b: float) -> str:
    """``"149 GiB"``, ``"12 MiB"`` (binary units)."""
    if not math.isfinite(b):
        return "unbounded memory"
    if b < 2**20:
        return "under 1 MiB"
    if b < _GIB:
        return f"{b / 2**20:.0f} MiB"
    return f"{b / _GIB:.3g} GiB"


def format_seconds(s: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"3 h"``, ``"5 days"``, ``"2.3e+08 years"``."""
    if not math.isfinite(s):
        return "forever"
    if s < 1:
        return "under 1 s"
    if s < 120:
        return f"{s:.0f} s"
    if s < 2 * 3600:
        return f"{s / 60:.0f} min"
    if s < 2 * 86400:
        return f"{s / 3600:.0f} h"
    if s < 2 * 365 * 86400:
        return f"{s / 86400:.0f} days"
    return f"{s / (365 * 86400):.2g} years"


def check_allocation(rows: int, cols: int, what: str, *, copies: float = 1.0) -> None:
    """Raise :class:`InvalidParameterError` when ``copies`` float64 ``rows x cols`` arrays would
    not fit in the memory available (``what`` names who needs them: "MMCC", "the tree's encoder")."""
    need, have = 8.0 * copies * rows * cols, available_memory()
    if need > have:
        raise InvalidParameterError(
            f"{what} needs a dense {rows} x {cols} matrix ({format_bytes(need)}), more than the "
            f"{format_bytes(have)} of memory available; use fewer steps"
        )
