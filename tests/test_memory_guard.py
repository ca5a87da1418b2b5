"""Issue 44 item 3: every dense form and buffer sized by user input goes through the one memory
guard (:func:`dpmf.resources.check_allocation`): a one-line :class:`~dpmf.errors.DPMFError` with
the estimate and how to go smaller, never numpy's ``ArrayMemoryError`` ("Unable to allocate 8.00
TiB"), in the library and in the CLI alike."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

import dpmf
from dpmf.errors import DPMFError, InvalidParameterError
from dpmf.resources import check_allocation


def _gaussian_epsilon(mu: float, delta: float) -> float:
    """Epsilon of the Gaussian mechanism with sensitivity / noise ``mu`` (Balle & Wang 2018, Thm 8)."""
    lo, hi = 0.0, 100.0
    for _ in range(200):
        eps = (lo + hi) / 2
        d = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        lo, hi = (eps, hi) if d > delta else (lo, eps)
    return hi


def test_the_issue_identity_account_answers_instead_of_allocating_8_tib(peak_memory):
    from dpmf.sampling import FixedOrderSampling
    from dpmf.strategies import Identity

    with peak_memory() as peak:
        r = dpmf.account(Identity(2**40), FixedOrderSampling(1, 2**40), 1.0, 1e-6)
    assert peak.bytes < 2**28, peak.bytes  # (nothing of the run's size is built)
    # one participation of a unit-sensitivity Gaussian step (no amplification claimed): the
    # Gaussian mechanism's epsilon, up to the accountant's pessimistic discretization
    exact = _gaussian_epsilon(1.0, 1e-6)
    assert exact <= r.epsilon <= exact + 1e-2
    assert r.epsilon == pytest.approx(dpmf.account(Identity(64), FixedOrderSampling(1, 64), 1.0, 1e-6).epsilon, abs=1e-9)


def _sqrt():
    from dpmf.strategies import ToeplitzStrategy

    return ToeplitzStrategy.sqrt_prefix_sum(2**40)


def _blt():
    from dpmf.strategies import BLT

    return BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(2**40)


def _bsr_noise():
    from dpmf.strategies import bsr

    return bsr(16, 4).streaming_noise(10**12, rng=0, noise_multiplier=2.0)


def _identity_noise():
    from dpmf.strategies import Identity

    return Identity(4).streaming_noise(10**13, rng=0)


def _tree_noise():
    from dpmf.strategies import BinaryTree

    return BinaryTree(8).streaming_noise((10**6, 10**6), rng=0)


def _blt_noise():
    from dpmf.strategies import BLT

    return BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(8).streaming_noise(10**12, rng=0)


def _dense_history():
    from dpmf.strategies import ToeplitzStrategy

    return ToeplitzStrategy.sqrt_prefix_sum(4096).streaming_noise(10**9, rng=0)


def _fft_noise():
    from dpmf.strategies import FFTMechanism

    return FFTMechanism(10**5).streaming_noise(10**6, rng=0)


def _fft_decoder():
    from dpmf.strategies import FFTMechanism

    return FFTMechanism(10**6).decoder()


def _tree_noising():
    from dpmf.strategies import BinaryTree

    return BinaryTree(10**6).noising_matrix()


def _identity_noising():
    from dpmf.strategies import Identity

    return Identity(10**7).noising_matrix()


def _toeplitz_noising():
    from dpmf.strategies import bsr

    return bsr(10**6, 4).noising_matrix()


def _optimal():
    from dpmf.strategies.optimal import optimal_multi_epoch_gram as optimize

    return optimize(10**6, epochs=1)


def _bandmf():
    from dpmf.strategies.bandmf import optimize_bandmf

    return optimize_bandmf(10**6, 4)


def _bisr():
    from dpmf.strategies import bisr

    return bisr(2**40, 4)


def _banded_toeplitz():
    from dpmf.strategies import optimize_banded_toeplitz

    return optimize_banded_toeplitz(2**40, 4)


def _batches(scheme):
    def call():
        from dpmf import sampling

        return next(iter(getattr(sampling, scheme[0])(*scheme[1:]).batches(10**13, 0)))

    return call


CASES = {
    "sqrt_prefix_sum(2**40)": _sqrt,
    "BLT.to_toeplitz(2**40)": _blt,
    "bisr(2**40)": _bisr,
    "optimize_banded_toeplitz(2**40)": _banded_toeplitz,
    "optimize(10**6)": _optimal,
    "optimize_bandmf(10**6)": _bandmf,
    "bsr.streaming_noise(10**12)": _bsr_noise,
    "Identity.streaming_noise(10**13)": _identity_noise,
    "BinaryTree.streaming_noise((1e6, 1e6))": _tree_noise,
    "BLT.streaming_noise(10**12)": _blt_noise,
    "sqrt(4096).streaming_noise(10**9)": _dense_history,
    "FFT.streaming_noise(10**6)": _fft_noise,
    "FFT(10**6).decoder()": _fft_decoder,
    "BinaryTree(10**6).noising_matrix()": _tree_noising,
    "Identity(10**7).noising_matrix()": _identity_noising,
    "bsr(10**6).noising_matrix()": _toeplitz_noising,
    "Poisson.batches(10**13)": _batches(("PoissonSampling", 0.5, 10)),
    "FixedOrder.batches(10**13)": _batches(("FixedOrderSampling", 1, 10)),
    "CyclicPoisson.batches(10**13)": _batches(("CyclicPoissonSampling", 0.5, 10, 2)),
    "MinSep.batches(10**13)": _batches(("MinSepSampling", 0.5, 10, 2)),
    "BallsInBins.batches(10**13)": _batches(("BallsInBinsSampling", 1, 10)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_what_cannot_fit_is_one_line_naming_the_memory(name, monkeypatch, peak_memory):
    import dpmf.resources as resources

    monkeypatch.setattr(resources, "available_memory", lambda: 4.0 * 2**30)
    with peak_memory() as peak, pytest.raises(InvalidParameterError) as info:
        CASES[name]()
    assert peak.bytes < 2**28, peak.bytes  # refused before its arrays were allocated
    message = str(info.value)
    assert "\n" not in message
    assert "more than the 4 GiB of memory available; use " in message, message
    assert ("GiB" in message.split("more than")[0]) and ("needs" in message)


def test_the_guard_lets_what_fits_through(monkeypatch):
    import dpmf.resources as resources
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import bsr

    noise = bsr(16, 4).streaming_noise(1000, rng=0, noise_multiplier=2.0)
    assert next(noise).shape == (1000,)
    assert next(iter(PoissonSampling(0.5, 4).batches(100, 0))).ndim == 1
    check_allocation(1000, 1000, "x")  # 8 MB
    monkeypatch.setattr(resources, "available_memory", lambda: 0.0)
    check_allocation(1000, 1000, "x")  # small arrays are never refused (no look at /proc in inner loops)
    with pytest.raises(InvalidParameterError):
        check_allocation(10**4, 10**4, "x")


def test_the_guard_message_names_the_estimate_and_the_way_down(monkeypatch):
    import dpmf.resources as resources

    monkeypatch.setattr(resources, "available_memory", lambda: 2.0**30)
    with pytest.raises(InvalidParameterError, match=r"^the thing needs a dense 100,000 x 100,000 array \(2 copies\) "
                       r"\(149 GiB\), more than the 1 GiB of memory available; use a smaller dim$"):
        check_allocation(10**5, 10**5, "the thing", copies=2, hint="use a smaller dim")
    with pytest.raises(InvalidParameterError, match=r"needs an array of 1,000,000,000 entries \(3.73 GiB\)"):
        check_allocation(1, 10**9, "the thing", itemsize=4)


def test_the_cli_refuses_the_same_in_one_line(tmp_path):
    from typer.testing import CliRunner

    from dpmf.cli.main import app

    res = CliRunner().invoke(app, ["strategy", "build", "sqrt-toeplitz", "--steps", str(2**40), "--out",
                                   str(tmp_path / "s.npz"), "--force"])
    assert res.exit_code == 2 and "Traceback" not in res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "of memory available" in lines[0], res.stderr


def test_dpmf_errors_only_for_huge_account_inputs():
    """The issue's shape over every catalog strategy the accountants take: an answer or a DPMFError."""
    from dpmf.sampling import BallsInBinsSampling, FixedOrderSampling, MinSepSampling
    from dpmf.strategies import BinaryTree, Identity, bsr

    n = 2**40
    for strategy in (Identity(n), BinaryTree(n), bsr(n, 4)):
        for scheme in (FixedOrderSampling(2, n), BallsInBinsSampling(2, n), MinSepSampling(0.01, n, n // 4)):
            try:
                r = dpmf.account(strategy, scheme, 1.0, 1e-6)
            except DPMFError:
                continue
            assert np.isfinite(r.epsilon)


@pytest.mark.parametrize("kind", ["sqrt", "blt", "fft"])
def test_torch_noise_buffers_go_through_the_same_guard(kind, monkeypatch):
    torch = pytest.importorskip("torch")
    import dpmf.resources as resources
    from dpmf.strategies import BLT, FFTMechanism, ToeplitzStrategy
    from dpmf.training.torch.noise import correlated_noise

    strategy = {"sqrt": lambda: ToeplitzStrategy.sqrt_prefix_sum(64),
                "blt": lambda: BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(64), "fft": lambda: FFTMechanism(64)}[kind]()
    params = [torch.zeros(10**7)]  # 40 MB a row: the buffers (2 to 64 rows) are over the 64 MiB that always fit
    monkeypatch.setattr(resources, "available_memory", lambda: 2.0**20)
    with pytest.raises(InvalidParameterError, match=r"needs a dense .* more than the 1 MiB of memory available; use "):
        correlated_noise(strategy, params, noise_multiplier=1.0, max_grad_norm=1.0, seed=0)
    if kind == "blt":  # (2 rows: 80 MB) what fits is let through
        monkeypatch.setattr(resources, "available_memory", lambda: 2.0**30)
        assert correlated_noise(strategy, params, noise_multiplier=1.0, max_grad_norm=1.0, seed=0).numel == 10**7


@pytest.mark.parametrize("pair", ["tree-poisson", "tree-fixed", "bsr-fixed", "bsr-balls", "identity-cyclic"])
def test_calibrate_at_2_to_the_40_steps_is_a_dpmf_error(pair, peak_memory):
    """dpmf.calibrate has no up-front estimate of its own (the CLI's is _check_run_cost): the O(n)
    arrays of the sensitivities, the tree's nodes and MMCC's structured rows refuse in dpmf words."""
    from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, PoissonSampling
    from dpmf.strategies import BinaryTree, Identity, bsr

    n = 2**40
    strategy = {"tree": BinaryTree(n), "bsr": bsr(n, 4), "identity": Identity(n)}[pair.split("-")[0]]
    scheme = {"poisson": PoissonSampling(0.01, n), "fixed": FixedOrderSampling(1, n),
              "balls": BallsInBinsSampling(2, n), "cyclic": CyclicPoissonSampling(0.01, n, 4)}[pair.split("-")[1]]
    with peak_memory() as peak, pytest.raises(DPMFError, match="memory"):
        dpmf.calibrate(strategy, scheme, 2.0, 1e-6)
    assert peak.bytes < 2**28, peak.bytes  # refused before the O(n) arrays were allocated
