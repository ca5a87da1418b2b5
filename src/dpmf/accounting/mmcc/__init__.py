"""MMCC: privacy amplification for matrix mechanisms (Choquette-Choo et al., ICLR 2024).

* :mod:`.tail_bounds` - Alg. 2/4 and App. F.3: posterior-probability tail bounds, sigma-free part;
* :mod:`.rows` - App. F.2/F.4: one pessimistic PLD per distinct row, serial/processes/Dask;
* :mod:`.grid` - the rows' loss grid: the requested one while it fits in memory, else a coarser one
  (the cost model sizes runs by it);
* :mod:`.structured` - the tail-bound structures of Toeplitz strategies and the binary tree from
  their parameters (Poisson and cyclic Poisson), without the dense encoder;
* :mod:`.accountant` - Alg. 1/3: :func:`account_mmcc`, :class:`MMCCAccountant`,
  :func:`calibrate_mmcc` (and :meth:`MMCCAccountant.calibrate`, which also returns the report),
  and the dispatch interface ``NAME`` / :func:`supports`.
"""

from dpmf.accounting.mmcc.accountant import (
    DEFAULT_GRID_FRACTION,
    NAME,
    MMCCAccountant,
    account_mmcc,
    calibrate_mmcc,
    noise_and_report,
    probe_mmcc,
    supports,
)
from dpmf.accounting.mmcc.rows import row_pld
from dpmf.accounting.mmcc.tail_bounds import TailBoundStructure, binomial_thresholds, tail_bound_structure

__all__ = [
    "NAME",
    "supports",
    "account_mmcc",
    "calibrate_mmcc",
    "probe_mmcc",
    "noise_and_report",
    "MMCCAccountant",
    "DEFAULT_GRID_FRACTION",
    "row_pld",
    "TailBoundStructure",
    "tail_bound_structure",
    "binomial_thresholds",
]
