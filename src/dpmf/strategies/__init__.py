"""Strategies (encoders C), workloads, participation schemas, sensitivity and error.

The multi-epoch matrix-factorization paper (Choquette-Choo et al., ICML 2023) and the strategies
the amplification papers use. Every strategy exposes ``n``, ``name``, ``describe()``,
``encoder()`` (dense, on request), ``sensitivity(participation)`` (a sound upper bound, exact
where documented) and ``prefix_sum_rmse()`` (per unit noise multiplier, for C as given).
``strategy_from_dict(s.describe())`` rebuilds ``s`` (:mod:`dpmf.strategies.serialization`).
"""

from dpmf.strategies.banded import bisr, bsr, optimize_banded_toeplitz
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

__all__ = [
    "Identity",
    "DenseStrategy",
    "ToeplitzStrategy",
    "ToeplitzNoise",
    "BinaryTree",
    "FFTMechanism",
    "Participation",
    "FixedEpochParticipation",
    "SensitivityResult",
    "sensitivity_squared",
    "prefix_sum",
    "momentum_sgd",
    "bsr",
    "bisr",
    "optimize_banded_toeplitz",
    "BLT",
    "BLTStrategy",
    "BLTNoise",
    "optimize_blt",
    "StreamingNoise",
    "IdentityNoise",
    "DenseNoise",
    "TreeNoise",
    "PregeneratedNoise",
    "strategy_from_dict",
    "participation_from_dict",
    "save_matrices",
]
