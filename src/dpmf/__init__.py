"""dpmf: differentially private training with correlated noise, and its privacy accounting.

See README.md for a tour. The layers (DESIGN.md): ``privacy`` (PLDs, Gaussian/mixture
mechanisms, RDP, GDP, calibration) < ``strategies`` | ``sampling`` < ``accounting`` < ``cli``.
"""

from dpmf._version import __version__
from dpmf import errors

__all__ = ["__version__", "errors"]
