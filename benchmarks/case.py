"""The benchmark protocol: one :class:`Case` per peer-vs-dpmf comparison.

A benchmark module ``benchmarks/bench_<topic>.py`` exposes ``CASES: list[Case]``. The runner
(``benchmarks/run.py``) times ``peer()`` and ``dpmf()`` (each called with no arguments, the
whole call is timed), then passes the last results of both to ``compare``, which must return
``(ok, detail)``. ``tolerance`` states in words what ``compare`` accepts; it is printed with the
results. ``slow=True`` cases are skipped by ``--quick``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Case:
    name: str
    peer: Callable[[], Any]
    dpmf: Callable[[], Any]
    compare: Callable[[Any, Any], tuple[bool, str]]
    tolerance: str
    peer_name: str = "dp_accounting"
    slow: bool = False
