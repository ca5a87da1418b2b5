"""dpmf: differentially private training with correlated noise, and its privacy accounting.

Quick start::

    import dpmf
    report = dpmf.account(dpmf.strategies.Identity(1000),
                          dpmf.sampling.PoissonSampling(sampling_prob=0.01, steps=1000),
                          noise_multiplier=1.0, delta=1e-6)
    print(report.summary())

Layers (DESIGN.md): ``privacy`` (PLDs, Gaussian/mixture mechanisms, RDP, GDP, calibration)
< ``strategies`` | ``sampling`` < ``accounting`` < ``planner`` < ``cli``.
"""

from dpmf import errors, privacy, sampling, strategies
from dpmf._version import __version__
from dpmf.accounting import PrivacyReport, account, calibrate

__all__ = [
    "__version__",
    "account",
    "calibrate",
    "PrivacyReport",
    "errors",
    "privacy",
    "sampling",
    "strategies",
]
