"""Amplification analyses: (strategy, sampling scheme, noise) -> PrivacyReport."""

from typing import TYPE_CHECKING

from dpmf._lazy import attach

#: public name -> the submodule that defines it (imported on first use, :mod:`dpmf._lazy`)
_EXPORTS = {
    "METHODS": ".dispatch",
    "Calibration": ".dispatch",
    "account": ".dispatch",
    "compose": ".composition",
    "calibrate": ".dispatch",
    "valid_methods": ".dispatch",
    "PrivacyReport": ".report",
    "Verification": ".verify",
    "verify_report": ".verify",
}

__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from dpmf.accounting.composition import compose
    from dpmf.accounting.dispatch import METHODS, Calibration, account, calibrate, valid_methods
    from dpmf.accounting.report import PrivacyReport
    from dpmf.accounting.verify import Verification, verify_report

__all__ = ["account", "calibrate", "compose", "Calibration", "PrivacyReport", "METHODS", "valid_methods", "verify_report", "Verification"]
