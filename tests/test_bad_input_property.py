"""Property: whatever a user types or hands over, dpmf answers or refuses in one line.

Hypothesis drives the command line (account, calibrate, plan, strategy build/show, individual
report, montecarlo run/report, verify) and the public API (``dpmf.account``, strategy and sampler
constructors, privacy functions, every file loader and writer) with generated bad input: numbers
out of range, NaN and infinities, wrong types, unknown names, truncated / garbage / foreign files
and unwritable paths. Every outcome must be a result, or a :class:`~dpmf.errors.DPMFError` (exit
status 2 on the CLI) whose message is one line -- never another exception, never a traceback, and
never a hang: each call runs under a per-call time limit.

The default run draws a bounded number of examples (seconds); ``-m slow`` runs many more.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import signal
import traceback
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, event, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

try:  # typer >= 0.16 vendors click
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover
    from click.exceptions import ClickException

import dpmf
from dpmf.errors import DPMFError

runner = CliRunner()

#: Per-call time limit (seconds): a call past it counts as a hang.
TIME_LIMIT = 60
#: no "explain" phase: it traces every line, which makes calls many times slower than the time limit
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
FAST = settings(max_examples=25, deadline=None, derandomize=True, phases=PHASES,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
LONG = settings(max_examples=400, deadline=None, phases=PHASES,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


class Hang(Exception):
    """Raised by the alarm when a call exceeds :data:`TIME_LIMIT`."""


@contextlib.contextmanager
def time_limit(seconds: float = TIME_LIMIT):
    def alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# ------------------------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Good files of every kind dpmf reads, and folders/paths to break writers with."""
    from dpmf.accounting.individual import IndividualGDPLedger
    from dpmf.accounting.montecarlo.run import MonteCarloRun
    from dpmf.sampling import PoissonSampling
    from dpmf.strategies import BinaryTree, catalog

    root = tmp_path_factory.mktemp("corpus")
    catalog.save(BinaryTree(8), root / "strategy.npz")
    led = IndividualGDPLedger(5, 1.0, noise_multiplier=2.0, run_id="r")
    led.step(np.full(5, 0.3))
    led.save(root / "ledger.npz")

    def gauss(strategy, scheme, sigma, m, rng, *, direction="remove"):
        y = rng.normal(1.0 if direction == "remove" else 0.0, sigma, m)
        ll = (2 * y - 1) / (2 * sigma**2)
        return ll if direction == "remove" else -ll

    mc = MonteCarloRun(None, PoissonSampling(1.0, 1), 1.0, 2000, seed=0, chunk_size=1000, sampler=gauss,
                       checkpoint=root / "checkpoint.npz")
    mc.run()
    report = dpmf.account(dpmf.strategies.Identity(8), PoissonSampling(0.5, 8), 2.0, 1e-5)
    (root / "report.json").write_text(report.to_json())
    (root / "regular-file").write_text("not a folder")
    np.save(root / "matrix.npy", np.tril(np.ones((4, 4))))
    return root


KINDS = ["strategy.npz", "ledger.npz", "checkpoint.npz", "report.json", "matrix.npy"]
MUTATIONS = ["as is", "truncate", "flip", "random", "empty", "folder", "missing", "pickled", "foreign", "npy",
             "bad metadata", "metadata list", "wrong field type"]


@st.composite
def files(draw, corpus_dir: Path, tag: str):
    """A path to a generated file: a good one of some kind, or one broken in some way."""
    kind = draw(st.sampled_from(KINDS))
    how = draw(st.sampled_from(MUTATIONS))
    raw = (corpus_dir / kind).read_bytes()
    out = corpus_dir / f"gen-{tag}-{draw(st.integers(0, 10**9))}-{kind}"
    if how == "as is":
        out.write_bytes(raw)
    elif how == "truncate":
        out.write_bytes(raw[: draw(st.integers(0, max(len(raw) - 1, 0)))])
    elif how == "flip":
        b = bytearray(raw)
        for _ in range(draw(st.integers(1, 8))):
            i = draw(st.integers(0, len(b) - 1))
            b[i] ^= draw(st.integers(1, 255))
        out.write_bytes(bytes(b))
    elif how == "random":
        out.write_bytes(draw(st.binary(min_size=1, max_size=600)))
    elif how == "empty":
        out.write_bytes(b"")
    elif how == "folder":
        return corpus_dir
    elif how == "missing":
        return corpus_dir / "does-not-exist.npz"
    elif how == "pickled":
        with open(out, "wb") as fh:
            np.savez(fh, metadata=np.array("{}"), x=np.array([{"a": 1}], dtype=object))
    elif how == "foreign":
        with open(out, "wb") as fh:
            np.savez(fh, weights=np.ones(3))
    elif how == "npy":
        with open(out, "wb") as fh:
            np.save(fh, np.ones((3, 3)))
    else:  # metadata variants of an npz of this kind (or of a strategy file)
        src = corpus_dir / (kind if kind.endswith(".npz") else "strategy.npz")
        with np.load(src, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
        meta = json.loads(str(arrays["metadata"]))
        if how == "bad metadata":
            arrays["metadata"] = np.array("{not json")
        elif how == "metadata list":
            arrays["metadata"] = np.array("[1, 2, 3]")
        else:
            key = draw(st.sampled_from(sorted(meta)))
            meta[key] = draw(st.sampled_from([None, "x", -1, [1], {"a": 1}, 1e308, True]))
            arrays["metadata"] = np.array(json.dumps(meta))
        with open(out, "wb") as fh:
            np.savez(fh, **arrays)
    return out


def bad_paths(corpus_dir: Path):
    """Paths nothing can be written to."""
    return st.sampled_from([
        corpus_dir / "no-such-folder" / "out.npz",
        corpus_dir,
        corpus_dir / "regular-file" / "out.npz",
    ])


# ------------------------------------------------------------------------------------------- values
NUMBERS = ["0", "-1", "nan", "inf", "-inf", "1e999", "0.5", "0.1", "1", "2", "1e-300", "1e300", "3.7", "1e-5"]
INTS = ["0", "-3", "1", "2", "4", "8", "16", "1000000000"]
#: Text the option parser itself refuses (a usage error): drawn rarely, so most examples get deeper.
GARBAGE = [[], [], [], [], [], [], ["--steps", "abc"], ["--delta", ""], ["--epochs", "2.5"], ["--bogus-option", "1"]]


def one_line_refusal(res) -> None:
    """A CLI result (invoked as the console script does, ``standalone_mode=False``): a usage error
    for click to print in one line (``dpmf.cli.main.run``), success, or status 2 with exactly one
    ``error:`` line on stderr -- never another exception, never a traceback."""
    exc = res.exception
    if isinstance(exc, ClickException):
        event("usage error (click)")
        return  # a usage error (bad int, unknown choice ...): run() prints it as one line, status 2
    if exc is not None and not isinstance(exc, SystemExit):
        raise AssertionError("".join(traceback.format_exception(exc))) from exc
    code = res.return_value if isinstance(res.return_value, int) else res.exit_code
    assert "Traceback" not in res.output
    assert code in (0, 1, 2, 3, 4, None), (code, res.output)  # 3, 4: dpmf verify, an edited / undigested report
    event("refused (dpmf error)" if code == 2 else f"answered (status {code})")
    if code == 2:
        lines = [line for line in res.stderr.splitlines() if line.strip() and not line.startswith("note: ")]
        assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr


def invoke(args) -> None:
    from dpmf.cli.main import app

    with time_limit():
        res = runner.invoke(app, [str(a) for a in args], standalone_mode=False)
    one_line_refusal(res)


def api(fn, *args, **kwargs):
    """A result, or a DPMFError with a one-line message."""
    try:
        with time_limit():
            out = fn(*args, **kwargs)
    except DPMFError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))
        event(f"{getattr(fn, '__name__', 'call')}: {type(exc).__name__}")
        return exc
    event(f"{getattr(fn, '__name__', 'call')}: result")
    return out


# ------------------------------------------------------------------------------------------- CLI
def cli_commands(corpus_dir: Path):
    strategies = st.one_of(
        st.sampled_from(["identity", "tree", "bsr", "bisr", "banded-toeplitz", "blt", "fft", "optimal", "bogus"]),
        files(corpus_dir, "s"),
    )
    samplings = st.sampled_from(["poisson", "fixed-order", "cyclic-poisson", "b-min-sep", "balls-in-bins"])
    methods = st.sampled_from(["auto", "pld", "mmcc", "unamplified", "allocation", "montecarlo"])
    garbage = st.sampled_from(GARBAGE)
    opt = lambda flag, values: st.one_of(st.just([]), values.map(lambda v: [flag, v]))  # noqa: E731
    # required options are left out now and then (a usage error), not half of the time
    often = lambda flag, values: st.tuples(st.integers(0, 9), values).map(  # noqa: E731
        lambda t: [] if t[0] == 0 else [flag, t[1]])
    # half of the values are in range, so that many commands get past the first check
    numbers = st.one_of(st.sampled_from(["0.1", "0.01", "1e-5", "0.5", "2"]), st.sampled_from(NUMBERS))
    ints = st.one_of(st.sampled_from(["1", "2", "4", "8"]), st.sampled_from(INTS))
    # valid sizes are small and valid noise is not tiny, so a valid configuration answers fast
    steps = st.sampled_from(["0", "-3", "8", "16", "16", "1000000000"])
    sigma = st.sampled_from(["0", "-1", "nan", "inf", "2", "10", "10"])

    common = st.tuples(
        strategies, samplings, often("--steps", steps), opt("--sampling-prob", numbers), opt("--epochs", ints),
        opt("--min-sep", ints), opt("--bands", ints), often("--delta", numbers), opt("--max-batch-size", ints),
        garbage,
    ).map(lambda t: ["--strategy", t[0], "--sampling", t[1], *[x for part in t[2:] for x in part]])
    account = st.tuples(common, often("--noise-multiplier", sigma), methods, opt("--samples", ints),
                        opt("--cache-dir", bad_paths(corpus_dir)), opt("--workers", ints)).map(
        lambda t: ["account", *t[0], *t[1], "--method", t[2], *t[3], *t[4], *t[5]])
    calibrate = st.tuples(common, often("--epsilon", numbers), st.sampled_from(["unamplified", "pld", "allocation",
                                                                              "auto"])).map(
        lambda t: ["calibrate", *t[0], *t[1], "--method", t[2]])
    plan = st.tuples(opt("--dataset-size", ints), opt("--batch-size", ints), opt("--epsilon", numbers),
                     bad_paths(corpus_dir)).map(lambda t: ["plan", *t[0], *t[1], *t[2], "--plot", t[3]])
    build = st.tuples(st.sampled_from(["identity", "tree", "bsr", "matrix", "optimal", "bogus"]),
                      opt("--steps", st.sampled_from(["0", "-3", "4", "16", "1000000000"])),
                      opt("--bands", ints), opt("--matrix", files(corpus_dir, "m")),
                      st.one_of(bad_paths(corpus_dir), st.just(corpus_dir / "built.npz"))).map(
        lambda t: ["strategy", "build", t[0], *t[1], *t[2], *t[3], "--out", t[4]])
    show = st.tuples(files(corpus_dir, "show"), st.sampled_from(["single", "fixed-epoch", "min-sep"]),
                     opt("--epochs", ints)).map(lambda t: ["strategy", "show", t[0], "--participation", t[1], *t[2]])
    individual = st.tuples(files(corpus_dir, "led"), opt("--delta", numbers),
                           opt("--plot", bad_paths(corpus_dir))).map(
        lambda t: ["individual", "report", t[0], *t[1], *t[2]])
    mc_report = st.tuples(files(corpus_dir, "mc"), opt("--delta", numbers), opt("--confidence", numbers)).map(
        lambda t: ["montecarlo", "report", t[0], *t[1], *t[2]])
    mc_run = st.tuples(often("--steps", steps), opt("--min-sep", ints), opt("--sampling-prob", numbers),
                       often("--noise-multiplier", sigma), often("--delta", numbers), opt("--samples", ints),
                       opt("--checkpoint", bad_paths(corpus_dir))).map(
        lambda t: ["montecarlo", "run", "--strategy", "bsr", "--bands", "2", *[x for p in t for x in p]])
    verify = st.tuples(files(corpus_dir, "v"), opt("--matrices", st.sampled_from(
        [corpus_dir / "nodir", corpus_dir / "regular-file", corpus_dir])), opt("--workers", ints)).map(
        lambda t: ["verify", t[0], *t[1], *t[2]])
    # issue 44: the commands the first battery left out
    compose = st.tuples(st.lists(files(corpus_dir, "c"), min_size=1, max_size=2),
                        opt("--times", st.sampled_from(["0", "-1", "2", "2.5", "abc", "1000000"])),
                        opt("--delta", numbers)).map(lambda t: ["compose", *t[0], *t[1], *t[2]])
    steps_cmd = st.tuples(often("--noise-multiplier", st.sampled_from([*NUMBERS, "100"])),
                          often("--epsilon", numbers), often("--delta", numbers)).map(
        lambda t: ["individual", "steps", *[x for p in t for x in p]])
    mc_resume = st.tuples(files(corpus_dir, "res"), opt("--delta", numbers), opt("--workers", ints)).map(
        lambda t: ["montecarlo", "resume", t[0], *t[1], *t[2]])
    return st.one_of(account, calibrate, plan, build, show, individual, mc_report, mc_run, verify, compose,
                     steps_cmd, mc_resume)


def _cli_property(corpus, data):
    args = data.draw(cli_commands(corpus))
    event(f"command: {' '.join(str(a) for a in args[:2] if not str(a).startswith(('/', '-')))}")
    invoke(args)


@FAST
@given(data=st.data())
def test_cli_bad_input_is_one_line_never_a_traceback_or_hang(corpus, data):
    _cli_property(corpus, data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_cli_bad_input_long(corpus, data):
    _cli_property(corpus, data)


# ------------------------------------------------------------------------------------------- API
#: numbers of every kind a caller may hand over (issue 44): Fractions, Decimals, numpy scalars, huge ints
KINDS_OF_NUMBERS = [Fraction(1, 3), Fraction(8), Decimal("0.5"), Decimal("NaN"), Decimal("8"), np.float32(0.5),
                    np.float64(math.nan), np.int64(8), np.int32(-2), np.bool_(True), 2**40, 10**30, -(10**30),
                    complex(1, 1), b"8", "abc", "nan", ""]
ANY = st.one_of(
    st.sampled_from([0, -1, 1, 2, 0.5, 1.0, math.nan, math.inf, -math.inf, 1e-300, 1e300, None, "1", [1], True]),
    st.sampled_from(KINDS_OF_NUMBERS),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(-5, 70),
)
INVALID = st.sampled_from([0, -1, 0.0, 1, 1.5, math.nan, math.inf, -math.inf, None, "1e-5", [1e-5], True])
SIGMA = st.one_of(st.sampled_from([0, -1, math.nan, math.inf, None, "2", True]), st.floats(2.0, 1e6))
SMALL_N = st.one_of(st.integers(-2, 24), st.sampled_from([0.5, None, "8", math.nan, True]))


def _strategy(kind, n, bands):
    from dpmf import strategies as S

    return {
        "identity": lambda: S.Identity(n),
        "tree": lambda: S.BinaryTree(n),
        "bsr": lambda: S.bsr(n, bands),
        "sqrt": lambda: S.ToeplitzStrategy.sqrt_prefix_sum(n),
        "dense": lambda: S.DenseStrategy(np.tril(np.ones((n, n))) if type(n) is int and 0 < n < 64 else n),
        "fft": lambda: S.FFTMechanism(n),
    }[kind]()


def _scheme(kind, q, n, b, epochs):
    from dpmf import sampling as P

    return {
        "poisson": lambda: P.PoissonSampling(q, n),
        "cyclic": lambda: P.CyclicPoissonSampling(q, n, b),
        "minsep": lambda: P.MinSepSampling(q, n, b),
        "balls": lambda: P.BallsInBinsSampling(epochs, n),
        "fixed": lambda: P.FixedOrderSampling(epochs, n),
    }[kind]()


def _api_property(corpus, data):
    from dpmf.accounting.individual import IndividualGDPLedger
    from dpmf.accounting.montecarlo.run import MonteCarloRun
    from dpmf.accounting.verify import verify_report
    from dpmf.privacy import gaussian_epsilon, gdp_epsilon, gdp_mu, mixture_of_gaussians, subsampled_gaussian
    from dpmf.sampling import scheme_from_dict
    from dpmf.strategies import BinaryTree, catalog, strategy_from_dict

    case = data.draw(st.sampled_from(["account", "calibrate", "privacy", "load", "save", "dicts"]))
    if case in ("account", "calibrate"):
        n = data.draw(st.one_of(st.integers(1, 16), SMALL_N))
        strat = api(_strategy, data.draw(st.sampled_from(["identity", "tree", "bsr", "sqrt", "dense", "fft"])), n,
                    data.draw(st.one_of(st.integers(0, 5), ANY)))
        scheme = api(_scheme, data.draw(st.sampled_from(["poisson", "cyclic", "minsep", "balls", "fixed"])),
                     data.draw(st.one_of(st.floats(0.01, 1.0), ANY)), n, data.draw(st.one_of(st.integers(1, 4), ANY)),
                     data.draw(st.one_of(st.integers(1, 3), ANY)))
        method = data.draw(st.sampled_from(["auto", "pld", "unamplified", "mmcc", "allocation", "magic"]))
        if case == "account":
            api(dpmf.account, strat, scheme, data.draw(SIGMA), data.draw(st.one_of(st.floats(1e-8, 0.1), ANY)),
                method=method)
        else:
            # (valid deltas stay small: with delta >= the chance to participate at all, every noise
            # gives epsilon 0 and the search walks sigma down to where each PLD takes seconds)
            api(dpmf.calibrate, strat, scheme, data.draw(st.one_of(ANY, st.floats(0.5, 50))),
                data.draw(st.one_of(st.floats(1e-8, 1e-4), INVALID)),
                method=data.draw(st.sampled_from(["unamplified", "pld", "allocation", "magic"])))
    elif case == "privacy":
        fn = data.draw(st.sampled_from(["gdp_mu", "gdp_epsilon", "gaussian_epsilon", "mixture", "subsampled"]))
        a, b, c = data.draw(ANY), data.draw(ANY), data.draw(ANY)
        if fn == "gdp_mu":
            api(gdp_mu, a, b)
        elif fn == "gdp_epsilon":
            api(gdp_epsilon, a, b)
        elif fn == "gaussian_epsilon":
            api(gaussian_epsilon, a, b, c)
        elif fn == "mixture":
            api(mixture_of_gaussians, data.draw(st.lists(ANY, max_size=4)), data.draw(st.lists(ANY, max_size=4)),
                data.draw(SIGMA))
        else:
            api(subsampled_gaussian, data.draw(SIGMA), a)
    elif case == "load":
        path = data.draw(files(corpus, "api"))
        loader = data.draw(st.sampled_from(["strategy", "ledger", "checkpoint", "report"]))
        {
            "strategy": lambda: api(catalog.load, path),
            "ledger": lambda: api(IndividualGDPLedger.load, path),
            "checkpoint": lambda: api(MonteCarloRun.load, path, read_only=True),
            "report": lambda: api(verify_report, path),
        }[loader]()
    elif case == "save":
        path = data.draw(bad_paths(corpus))
        what = data.draw(st.sampled_from(["ledger", "strategy"]))
        if what == "ledger":
            api(IndividualGDPLedger(3, 1.0).save, path)
        else:
            api(catalog.save, BinaryTree(4), path)
    else:
        d = data.draw(st.dictionaries(st.sampled_from(["name", "n", "steps", "sampling_prob", "min_sep", "epochs",
                                                       "bands", "matrix", "scale", "coefs"]), ANY, max_size=5))
        d.setdefault("name", data.draw(st.sampled_from(["identity", "binary_tree", "toeplitz", "poisson",
                                                        "b-min-sep", "blt", "x"])))
        api(strategy_from_dict, d)
        api(scheme_from_dict, d)


@FAST
@given(data=st.data())
def test_api_bad_input_is_a_dpmf_error_never_another_exception(corpus, data):
    _api_property(corpus, data)


@pytest.mark.slow
@LONG
@given(data=st.data())
def test_api_bad_input_long(corpus, data):
    _api_property(corpus, data)


# ------------------------------------------------------------------ issue 44: more entry points, each kind of junk
#: the new cases are cheap: each must end within this many seconds
CHEAP = 20


def _junk_entry(data):
    """One public entry point sized or parametrized by user input, called with drawn junk."""
    from dpmf import sampling as P
    from dpmf import strategies as S
    from dpmf.privacy import gdp_mu

    junk = st.one_of(st.sampled_from(KINDS_OF_NUMBERS), ANY)
    size = st.one_of(st.sampled_from([1, 8, 2**40, 10**13, 0, -1]), junk)
    x, y, z = data.draw(size), data.draw(junk), data.draw(junk)
    which = data.draw(st.sampled_from(["strategy", "noise", "batches", "account", "gdp", "compose", "blt"]))
    if which == "strategy":
        kind = data.draw(st.sampled_from(["Identity", "BinaryTree", "FFTMechanism", "sqrt", "bsr", "bisr"]))
        make = {"sqrt": S.ToeplitzStrategy.sqrt_prefix_sum, "bsr": lambda n: S.bsr(n, 4),
                "bisr": lambda n: S.bisr(n, 4)}.get(kind) or getattr(S, kind)
        return make, (x,), {}
    if which == "noise":
        strategy = data.draw(st.sampled_from([S.Identity(8), S.bsr(16, 4), S.BinaryTree(8)]))
        return strategy.streaming_noise, (x,), {"rng": data.draw(st.sampled_from([0, y])), "noise_multiplier": z}
    if which == "batches":
        scheme = data.draw(st.sampled_from([P.PoissonSampling(0.5, 4), P.FixedOrderSampling(1, 4),
                                            P.BallsInBinsSampling(1, 4), P.MinSepSampling(0.5, 4, 2)]))
        return (lambda n, rng: next(iter(scheme.batches(n, rng)))), (x, data.draw(st.sampled_from([0, y]))), {}
    if which == "account":
        return dpmf.account, (S.Identity(8), P.PoissonSampling(0.5, 8), y, z), {}
    if which == "gdp":
        return gdp_mu, (y, z), {}
    if which == "blt":
        return (lambda n: S.BLT([0.9, 0.4], [0.3, 0.2]).to_toeplitz(n)), (x,), {}
    report = dpmf.account(S.Identity(8), P.PoissonSampling(0.5, 8), 2.0, 1e-5)
    return dpmf.compose, ([report],), {"times": data.draw(st.one_of(st.sampled_from([2, 10**12]), junk)),
                                       "delta": data.draw(st.sampled_from([1e-5, y]))}


@settings(max_examples=40, deadline=None, derandomize=True, phases=PHASES,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_every_kind_of_junk_is_an_answer_or_a_dpmf_error_quickly(data, monkeypatch):
    """Fractions, Decimals, numpy scalars, huge sizes, strings: a result or a one-line DPMFError, each
    within :data:`CHEAP` seconds, and never numpy's MemoryError (the memory guard refuses first)."""
    import dpmf.resources as resources

    monkeypatch.setattr(resources, "available_memory", lambda: 2.0 * 2**30)  # as the 2 GiB bound
    fn, args, kwargs = _junk_entry(data)
    try:
        with time_limit(CHEAP):
            fn(*args, **kwargs)
    except DPMFError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))
        event(f"refused: {type(exc).__name__}")
    else:
        event("answered")


#: junk in the environment variables dpmf reads
JUNK_ENV = [("DPMF_PROGRESS_INTERVAL", "abc"), ("DPMF_PROGRESS_INTERVAL", "-1"), ("DPMF_PROGRESS_INTERVAL", "nan"),
            ("DPMF_PROGRESS_INTERVAL", "inf"), ("DPMF_PROGRESS_INTERVAL", "1e999"), ("DPMF_PROGRESS", "of"),
            ("DPMF_PROGRESS", ""), ("DPMF_PROGRESS", "LOG"), ("COLUMNS", "abc"), ("COLUMNS", "0"), ("COLUMNS", "-5"),
            ("COLUMNS", "100000")]


@pytest.mark.parametrize("var,value", JUNK_ENV, ids=[f"{k}={v}" for k, v in JUNK_ENV])
def test_junk_environment_is_one_line_or_ignored(var, value):
    from dpmf.cli.main import app

    with time_limit(CHEAP):
        res = runner.invoke(app, ["individual", "steps", "--noise-multiplier", "100", "--epsilon", "0.81563",
                                  "--delta", "1e-5"], env={var: value}, standalone_mode=False)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    code = res.return_value if isinstance(res.return_value, int) else res.exit_code
    assert code in (0, 2, None) and "Traceback" not in res.output, res.output
    if code == 2:
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    else:
        assert "420 full-gradient steps" in res.stdout
    if var == "DPMF_PROGRESS_INTERVAL" and value in ("abc", "-1", "nan"):
        assert "DPMF_PROGRESS_INTERVAL" in res.stderr  # refused, naming the variable


def test_the_time_limit_fires():
    import time

    with pytest.raises(Hang):
        with time_limit(0.2):
            time.sleep(2)
