"""Strategies (encoders C), workloads, participation schemas, sensitivity and error.

The multi-epoch matrix-factorization paper (Choquette-Choo et al., ICML 2023) and the strategies
the amplification papers use. Every strategy exposes ``n``, ``name``, ``describe()``,
``encoder()`` (dense, on request), ``sensitivity(participation)`` (a sound upper bound, exact
where documented) and ``prefix_sum_rmse()`` (per unit noise multiplier, for C as given).
``strategy_from_dict(s.describe())`` rebuilds ``s`` (:mod:`dpmf.strategies.serialization`).
"""

from typing import TYPE_CHECKING

from dpmf._lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__, globals())

if TYPE_CHECKING:  # pragma: no cover - the public names (imported on first use: dpmf._lazy.attach_stub)
    from dpmf.strategies.banded import bisr, bsr, optimize_banded_toeplitz
    from dpmf.strategies.bandinv import BandInvStrategy, optimize_banded_inverse_toeplitz
    from dpmf.strategies.blt import BLT, BLTNoise, BLTStrategy, optimize_blt
    from dpmf.strategies.dense import DenseStrategy
    from dpmf.strategies.fft import FFTMechanism
    from dpmf.strategies.identity import Identity
    from dpmf.strategies.participation import Participation
    from dpmf.strategies.sensitivity import FixedEpochParticipation, SensitivityResult, sensitivity_squared
    from dpmf.strategies.serialization import participation_from_dict, save_matrices, strategy_from_dict
    from dpmf.strategies.streaming import DenseNoise, IdentityNoise, PregeneratedNoise, StreamingNoise, TreeNoise
    from dpmf.strategies.toeplitz import ToeplitzNoise, ToeplitzStrategy
    from dpmf.strategies.tree import BinaryTree
    from dpmf.strategies.workloads import momentum_sgd, prefix_sum
