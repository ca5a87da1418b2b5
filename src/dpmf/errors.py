"""The dpmf exception hierarchy (bottom layer: imports nothing from dpmf).

Every error dpmf raises on purpose is a :class:`DPMFError`. Messages name the argument, the
value it had, and what would have been valid, so a CLI can print them as one line.
"""

from __future__ import annotations


class DPMFError(Exception):
    """Base class of every error raised by dpmf on purpose."""


class InvalidParameterError(DPMFError, ValueError):
    """An argument is out of range, of the wrong shape, NaN, or inconsistent with another."""


class NoiseTooSmallError(InvalidParameterError):
    """A noise multiplier below the smallest an accountant can evaluate with its settings (e.g. one
    step's privacy-loss grid would have too many points). ``smallest`` is the smallest noise
    multiplier it accepts with the same settings: calibration searches stop there instead of
    failing (:func:`dpmf.privacy.calibration.smallest_noise`)."""

    def __init__(self, message: str, smallest: float) -> None:
        super().__init__(message)
        self.smallest = float(smallest)

    def __reduce__(self):  # (raised in worker processes: must survive pickling)
        return (type(self), (str(self), self.smallest))


class UnsupportedConfigurationError(DPMFError):
    """The inputs are valid, but no sound method covers this combination (for example an
    amplification analysis asked for an encoder with negative entries)."""


class NumericalError(DPMFError, ArithmeticError):
    """A computation could not reach a sound result (no bracket, no convergence, overflow)."""


class CalibrationError(NumericalError):
    """No parameter value in the search range meets the privacy target."""


class CostLimitError(DPMFError):
    """A run would take far longer or more memory than allowed (an up-front, rough estimate from
    :mod:`dpmf.accounting.cost`); the CLI's ``--force`` proceeds anyway."""


class DPMFWarning(UserWarning):
    """Valid input that is almost always a mistake (e.g. a min-separation longer than the run);
    the computation goes ahead. The CLI refuses these outright."""


__all__ = [
    "DPMFError",
    "InvalidParameterError",
    "NoiseTooSmallError",
    "UnsupportedConfigurationError",
    "NumericalError",
    "CalibrationError",
    "CostLimitError",
    "DPMFWarning",
]
