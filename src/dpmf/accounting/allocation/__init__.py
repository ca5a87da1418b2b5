"""Random-allocation (balls-in-bins) accounting for matrix mechanisms, sampling-free.

Schuchardt & Kalinin, "Sampling-free privacy accounting for matrix mechanisms under random
allocation" (arXiv 2601.21636); digest ``notes/random-allocation.md``. Two sound accountants on
the dominating pair of :mod:`.dominating_pair`: the Rényi dynamic program (:mod:`.renyi`, Sec. 3)
and conditional composition (:mod:`.conditional`, Sec. 4); :mod:`.accountant` reports the tighter.
For the identity (DP-SGD), :mod:`.pld` computes the PLD of the pair itself (Feldman & Shenfeld,
arXiv 2602.17284), tight up to a pessimistic discretization; fresh slots and k-of-t are
compositions of it (:mod:`.pld_compose`). For any other non-negative ``C`` (dpmf's own arguments),
``allocation_pld`` takes the smallest of reductions to that pair or to Markov-chain surrogates:
one reused slot :mod:`.correlated` and :mod:`.surrogates.markov_fit`; fresh slots :mod:`.fresh_correlated`;
``num_selected > 1`` :mod:`.k_of_t_correlated`.
"""

from dpmf.accounting.allocation.dominating_pair import (
    band_truncation,
    cyclic_bandwidth,
    gram_matrix,
    mixture_means,
)
from dpmf.accounting.allocation.renyi import RenyiAllocation, add_rdp, remove_rdp
from dpmf.accounting.allocation.conditional import conditional_epsilon
from dpmf.accounting.allocation.pld import (
    account_allocation_pld,
    allocation_pld_epsilon,
    calibrate_allocation_pld,
)
from dpmf.accounting.allocation.accountant import (
    NAME,
    AllocationProblem,
    account_allocation,
    calibrate_allocation,
    supports,
)

__all__ = [
    "mixture_means",
    "gram_matrix",
    "band_truncation",
    "cyclic_bandwidth",
    "remove_rdp",
    "add_rdp",
    "RenyiAllocation",
    "conditional_epsilon",
    "NAME",
    "supports",
    "AllocationProblem",
    "account_allocation",
    "calibrate_allocation",
    "allocation_pld_epsilon",
    "account_allocation_pld",
    "calibrate_allocation_pld",
]
