"""Floating-point constants shared by the accountants' pessimistic roundings.

Every bound that is computed in float64 and must stay an *upper* bound widens its result by a
multiple of the unit roundoff ``u = 2^-53`` (the largest relative error of one correctly rounded
float64 operation; Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., Sec. 2.2).
One definition here, imported wherever a rounding allowance is written.
"""

from __future__ import annotations

UNIT_ROUNDOFF: float = 2.0**-53
"""Unit roundoff of IEEE-754 binary64: ``fl(x op y) = (x op y)(1 + d)`` with ``|d| <= 2^-53``."""
