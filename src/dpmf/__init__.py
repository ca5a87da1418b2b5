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
from dpmf._lazy import attach_stub
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

__getattr__, __dir__, _ = attach_stub(__name__, __file__, globals())

if TYPE_CHECKING:  # pragma: no cover - the public names (imported on first use: dpmf._lazy.attach_stub)
    from dpmf import accounting, files, planner, plots, privacy, sampling, strategies
    from dpmf.accounting import PrivacyReport, account, calibrate, compose
