"""Monte Carlo accounting (Dong & Ganesh 2026, ``papers/001``): privacy-loss samples of the dominating
pair, their sufficient statistics, estimates with confidence, certification by Algorithm 5, and long
resumable / distributed runs.

Modules: ``losses`` (samplers), ``statistics`` (exact counts on a pessimistic grid, confidence
bounds), ``certify`` (Alg. 5, Thm. A.1), ``run`` (chunks, checkpoints, Dask), ``accountant``
(``account_montecarlo``, ``calibrate_montecarlo``).
"""

from dpmf.accounting.montecarlo.accountant import (
    EVR_NAME,
    NAME,
    MonteCarloCalibration,
    account_montecarlo,
    calibrate_montecarlo,
    montecarlo_report,
    supports,
)
from dpmf.accounting.montecarlo.certify import (
    EVROutcome,
    OverallDelta,
    base_delta_for,
    estimate_verify_release,
    minimum_samples,
    overall_delta,
    verifier_acceptance_bound,
    verify,
)
from dpmf.accounting.montecarlo.run import MonteCarloRun, RunConfig, resume
from dpmf.accounting.montecarlo.statistics import (
    LossHistogram,
    kl_bernoulli,
    kl_lower_confidence,
    kl_upper_confidence,
)

__all__ = [
    "NAME",
    "EVR_NAME",
    "supports",
    "account_montecarlo",
    "calibrate_montecarlo",
    "montecarlo_report",
    "MonteCarloCalibration",
    "MonteCarloRun",
    "RunConfig",
    "resume",
    "LossHistogram",
    "kl_bernoulli",
    "kl_upper_confidence",
    "kl_lower_confidence",
    "minimum_samples",
    "overall_delta",
    "base_delta_for",
    "verifier_acceptance_bound",
    "verify",
    "estimate_verify_release",
    "EVROutcome",
    "OverallDelta",
]
