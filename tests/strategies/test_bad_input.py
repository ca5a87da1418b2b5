"""The issue's bad-input list, through the public constructors and ``catalog.build``: non-square
or non-lower-triangular C where the use is adaptive, NaN, bands < 1 or > n, epochs that do not
divide steps where required, a learning rate <= 0. Each raises a DPMFError subclass whose
message names the argument."""

from __future__ import annotations

import numpy as np
import pytest

from dpmf.errors import InvalidParameterError
from dpmf.strategies import catalog
from dpmf.strategies.banded import bisr, bsr, optimize_banded_toeplitz
from dpmf.strategies.bandmf import optimize_bandmf
from dpmf.strategies.blt import BLT, BLTStrategy, optimize_blt
from dpmf.strategies.dense import DenseStrategy
from dpmf.strategies.fft import FFTMechanism
from dpmf.strategies.identity import Identity
from dpmf.strategies.optimal import optimal_multi_epoch_gram, single_epoch_optimal
from dpmf.strategies.participation import Participation
from dpmf.strategies.sensitivity import FixedEpochParticipation
from dpmf.strategies.toeplitz import ToeplitzStrategy
from dpmf.strategies.tree import BinaryTree
from dpmf.strategies.workloads import momentum_sgd

NAN = float("nan")
LOWER = np.tril(np.ones((4, 4)))

CASES = [
    # non-square / non-lower-triangular / singular C where the use is adaptive
    ("matrix-wide", lambda: catalog.build("matrix", 4, matrix=np.ones((4, 5))), "square"),
    ("matrix-upper", lambda: catalog.build("matrix", 4, matrix=LOWER.T), "lower triangular"),
    ("matrix-singular", lambda: catalog.build("matrix", 4, matrix=LOWER - np.eye(4)), "invertible"),
    ("matrix-3d", lambda: catalog.build("matrix", 4, matrix=np.ones((4, 4, 4))), "2-dimensional"),
    ("matrix-size", lambda: catalog.build("matrix", 5, matrix=LOWER), "steps=5"),
    ("matrix-missing", lambda: catalog.build("matrix", 4), "needs a matrix"),
    ("dense-upper", lambda: DenseStrategy(LOWER.T), "lower triangular"),
    ("dense-wide-nonadaptive", lambda: DenseStrategy(np.ones((3, 4)), adaptive=False), "rows"),
    # NaN
    ("matrix-nan", lambda: catalog.build("matrix", 4, matrix=np.where(LOWER == 1, NAN, 0.0)), "finite"),
    ("toeplitz-nan", lambda: ToeplitzStrategy([1.0, NAN], 4), "finite"),
    ("blt-nan", lambda: BLT([NAN], [0.1]), "finite"),
    ("steps-nan", lambda: catalog.build("identity", NAN), "steps"),
    ("identity-nan", lambda: Identity(NAN), "n"),
    ("tree-nan", lambda: BinaryTree(NAN), "n"),
    ("tree-scale-nan", lambda: BinaryTree(4, NAN), "scale"),
    ("fft-nan", lambda: FFTMechanism(NAN), "n"),
    ("momentum-nan", lambda: momentum_sgd(4, NAN), "momentum"),
    ("lr-nan", lambda: catalog.workload_spec(4, 0.5, [1.0, NAN, 1.0, 1.0]), "learning_rates"),
    # bands < 1 or > n
    ("bsr-bands-0", lambda: bsr(8, 0), "bands"),
    ("bisr-bands-9", lambda: bisr(8, 9), "bands"),
    ("banded-toeplitz-bands-9", lambda: optimize_banded_toeplitz(8, 9), "bands"),
    ("bandmf-bands-0", lambda: optimize_bandmf(8, 0), "bands"),
    ("catalog-bands-missing", lambda: catalog.build("banded", 8), "needs bands"),
    ("catalog-bands-nan", lambda: catalog.build("bsr", 8, bands=NAN), "bands"),
    ("catalog-bands-negative", lambda: catalog.build("bisr", 8, bands=-1), "bands"),
    # epochs that do not divide steps where required
    ("optimal-epochs", lambda: catalog.build("optimal", 10, epochs=3), "epochs must divide"),
    ("blt-epochs", lambda: catalog.build("blt", 10, epochs=3), "epochs must divide"),
    ("gram-epochs", lambda: optimal_multi_epoch_gram(10, 3), "epochs must divide"),
    ("epochs-zero", lambda: catalog.build("optimal", 10, epochs=0), "epochs"),
    ("blt-epochs-gt-n", lambda: optimize_blt(4, 1, 5), "epochs"),
    ("fixed-point-epochs", lambda: catalog.build("optimal", 8, epochs=2, solver="fixed-point"), "epochs=1"),
    # learning rate <= 0 (and other workload errors)
    ("lr-zero", lambda: catalog.workload_spec(4, 0.5, [1.0, 0.0, 1.0, 1.0]), "learning_rates"),
    ("lr-negative", lambda: momentum_sgd(4, 0.5, [1.0, -1.0, 1.0, 1.0]), "learning_rates"),
    ("lr-length", lambda: catalog.workload_spec(4, 0.5, [1.0, 1.0]), "learning_rates"),
    ("momentum-one", lambda: catalog.workload_spec(4, 1.0), "momentum"),
    ("momentum-negative", lambda: catalog.workload_spec(4, -0.1), "momentum"),
    ("single-epoch-singular-workload", lambda: single_epoch_optimal(np.tril(np.ones((3, 3))) - np.eye(3)), "A"),
    ("workload-foreign", lambda: catalog.build("optimal", 4, workload={"kind": "adam"}), "workload"),
    # options
    ("kind", lambda: catalog.build("bogus", 4), "kind must be one of"),
    ("solver", lambda: catalog.build("optimal", 4, solver="sgd"), "solver"),
    ("constraints", lambda: catalog.build("optimal", 4, constraints="x"), "constraints"),
    ("buffers", lambda: catalog.build("blt", 8, buffers=0), "buffers"),
    ("tree-scale-zero", lambda: BinaryTree(4, 0.0), "scale"),
    ("blt-strategy-foreign", lambda: BLTStrategy(np.ones(4), 4, blt="blt"), "blt"),
    ("blt-strategy-scale", lambda: BLTStrategy.from_blt(BLT([0.5], [0.1]), 4, scale=-1.0), "scale"),
    ("participation-too-wide", lambda: DenseStrategy(LOWER).sensitivity(Participation(2, 5)), "min_sep"),
    ("identity-participation-type", lambda: Identity(4).sensitivity("single"), "participation"),
    ("participation-type", lambda: ToeplitzStrategy([1.0], 4).sensitivity("single"), "participation"),
    ("participation-k", lambda: FixedEpochParticipation(0, 2), "max_participations"),
]


@pytest.mark.parametrize("make, match", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_raises_a_clear_error(make, match):
    with pytest.raises(InvalidParameterError, match=match):
        make()


def test_zero_encoder_is_rejected():
    # an all-zero C has no inverse (and sensitivity 0: it could not be normalized)
    with pytest.raises(InvalidParameterError, match="invertible"):
        DenseStrategy(np.zeros((3, 3)))
    with pytest.raises(InvalidParameterError, match="coefs"):
        ToeplitzStrategy([0.0, 1.0], 3)
