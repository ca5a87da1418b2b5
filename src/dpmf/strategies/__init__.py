"""Strategies (encoders C), participation schemas, sensitivity and error."""

from dpmf.strategies.identity import Identity
from dpmf.strategies.participation import Participation

__all__ = ["Identity", "Participation"]
