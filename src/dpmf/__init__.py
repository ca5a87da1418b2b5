"""dpmf: differentially private training with correlated noise, and its privacy accounting.

Quick start::

    import dpmf
    report = dpmf.account(dpmf.strategies.Identity(1000),
                          dpmf.sampling.PoissonSampling(sampling_prob=0.01, steps=1000),
                          noise_multiplier=1.0, delta=1e-6)
    print(report.summary())

Layers (docs/design.md): ``privacy`` (PLDs, Gaussian/mixture mechanisms, RDP, GDP, calibration)
< ``strategies`` | ``sampling`` < ``accounting`` < ``planner`` < ``cli``.

Subpackages and the names below are imported on first use (:mod:`dpmf._lazy`), so ``import dpmf``
costs milliseconds; ``dp_accounting`` and SciPy load only when a computation needs them.
"""

from typing import TYPE_CHECKING

from dpmf import errors
from dpmf._lazy import attach
from dpmf._version import __version__

__all__ = [
    "__version__",
    "account",
    "calibrate",
    "compose",
    "PrivacyReport",
    "errors",
    "privacy",
    "sampling",
    "strategies",
]

_EXPORTS = {
    "account": ".accounting",
    "calibrate": ".accounting",
    "compose": ".accounting",
    "plots": ".plots",
    "PrivacyReport": ".accounting",
    "accounting": ".accounting",
    "privacy": ".privacy",
    "sampling": ".sampling",
    "strategies": ".strategies",
    "planner": ".planner",
    "files": ".files",
}

__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from dpmf import accounting, privacy, sampling, strategies
    from dpmf.accounting import PrivacyReport, account, calibrate, compose
