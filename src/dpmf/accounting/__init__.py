"""Amplification analyses: (strategy, sampling scheme, noise) -> PrivacyReport."""

from dpmf.accounting.dispatch import METHODS, Calibration, account, calibrate, valid_methods
from dpmf.accounting.report import PrivacyReport
from dpmf.accounting.verify import Verification, verify_report

__all__ = ["account", "calibrate", "Calibration", "PrivacyReport", "METHODS", "valid_methods", "verify_report", "Verification"]
