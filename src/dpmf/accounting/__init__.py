"""Amplification analyses: (strategy, sampling scheme, noise) -> PrivacyReport."""

from typing import TYPE_CHECKING

from dpmf._lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__, globals())

if TYPE_CHECKING:  # pragma: no cover - the public names (imported on first use: dpmf._lazy.attach_stub)
    from dpmf.accounting.composition import compose
    from dpmf.accounting.dispatch import METHODS, Calibration, account, calibrate, valid_methods
    from dpmf.accounting.report import PrivacyReport
    from dpmf.accounting.verify import Verification, verify_report
