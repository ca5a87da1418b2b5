"""Individual privacy accounting (Koskela, Tobaben & Honkela, ICLR 2023).

GDP filters and odometers for fully adaptive composition, a per-example ledger, the Rényi filter
baseline (Feldman & Zrnic), the approximate per-example (epsilon, delta) accountant for DP-SGD,
and a framework-agnostic filtered DP-GD step.
"""

from dpmf.accounting.individual.filtered_step import FilteredStep, filtered_step
from dpmf.accounting.individual.gdp_filter import GDPFilter, GDPOdometer, IndividualGDPLedger
from dpmf.accounting.individual.rdp_filter import IndividualRDPLedger, best_gaussian_order, rdp_budget
from dpmf.accounting.individual.steps import full_gradient_steps, gdp_steps, rdp_steps

__all__ = [
    "GDPFilter",
    "GDPOdometer",
    "IndividualGDPLedger",
    "IndividualRDPLedger",
    "rdp_budget",
    "best_gaussian_order",
    "gdp_steps",
    "rdp_steps",
    "full_gradient_steps",
    "filtered_step",
    "FilteredStep",
]
