"""Strategies (encoders C), workloads, participation schemas, sensitivity and error.

The multi-epoch matrix-factorization paper (Choquette-Choo et al., ICML 2023) and the strategies
the amplification papers use. Every strategy exposes ``n``, ``name``, ``describe()``,
``encoder()`` (dense, on request), ``sensitivity(participation)`` (a sound upper bound, exact
where documented) and ``prefix_sum_rmse()`` (per unit noise multiplier, for C as given).
``strategy_from_dict(s.describe())`` rebuilds ``s`` (:mod:`dpmf.strategies.serialization`).
"""

from typing import TYPE_CHECKING

from dpmf._lazy import attach

#: public name -> the submodule that defines it (imported on first use, :mod:`dpmf._lazy`)
_EXPORTS = {
    "bisr": ".banded",
    "bsr": ".banded",
    "optimize_banded_toeplitz": ".banded",
    "BandInvStrategy": ".bandinv",
    "optimize_banded_inverse_toeplitz": ".bandinv",
    "BLT": ".blt",
    "BLTNoise": ".blt",
    "BLTStrategy": ".blt",
    "optimize_blt": ".blt",
    "DenseStrategy": ".dense",
    "FFTMechanism": ".fft",
    "Identity": ".identity",
    "Participation": ".participation",
    "FixedEpochParticipation": ".sensitivity",
    "SensitivityResult": ".sensitivity",
    "sensitivity_squared": ".sensitivity",
    "participation_from_dict": ".serialization",
    "save_matrices": ".serialization",
    "strategy_from_dict": ".serialization",
    "DenseNoise": ".streaming",
    "IdentityNoise": ".streaming",
    "PregeneratedNoise": ".streaming",
    "StreamingNoise": ".streaming",
    "TreeNoise": ".streaming",
    "ToeplitzNoise": ".toeplitz",
    "ToeplitzStrategy": ".toeplitz",
    "BinaryTree": ".tree",
    "momentum_sgd": ".workloads",
    "prefix_sum": ".workloads",
}

__getattr__, __dir__ = attach(__name__, _EXPORTS, globals())

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
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
    "BandInvStrategy",
    "optimize_banded_inverse_toeplitz",
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
