"""PyTorch training: dpmf's ``make_private`` against Opacus 1.6.0 (DP-SGD), and what correlated noise costs.

Needs ``torch`` (the ``torch`` extra), ``opacus==1.6.0`` (``bench`` extra) and scikit-learn (digits).
Every timed function pins torch to one thread (``torch.set_num_threads(1)``) so that step times are
stable on a shared 2-core machine. Step times are per optimizer step, including fetching the batch
from the data loader (Poisson sampling on both sides), medians over the timed steps after warm-up.

(a) DP-SGD step, Opacus vs dpmf, same model, data, sampling rate and noise multiplier:

* ``torch_step_digits``: MLP 64-32-10 on scikit-learn's digits (1,437 training examples,
  standardized), ``DataLoader(batch_size=64)`` -> Poisson rate ``q = 1 / len(loader) = 1/23`` for both.
  Peer: ``PrivacyEngine(accountant="prv").make_private(..., poisson_sampling=True,
  grad_sample_mode="hooks")``; dpmf: ``make_private(Identity(T), PoissonSampling(q, T))`` with
  ``grad_sample_mode="functorch"`` (its default). 10 warm-up + 100 timed steps, sigma = 10 (large,
  so the check below sees the noise), SGD lr 0.01.
* ``torch_step_1m``: MLP 784-1024-256-10 (1,068,810 parameters) on 4,096 random examples, batch 64
  (``q = 1/64``), sigma = 1, 3 warm-up + 20 timed steps.
* agreement: both add ``N(0, sigma^2 C^2)`` to the clipped sum and divide by the expected batch size
  (Opacus ``int(q m)``, dpmf ``q m``), so the per-coordinate standard deviation of ``.grad`` after a
  step must be ``sigma C / B`` (the clipped mean, norm <= 1, is negligible next to the noise here).
  Pooled over the last 10 steps (digits) / the last step (1M): each side within 3% (digits) / 1% (1M)
  of its expected value.
* ``sigma_prv_eps{1,4,8}`` and ``sigma_rdp_eps4``: the noise multiplier for (epsilon, delta = 1e-5,
  q = 1/23, 460 steps = 20 epochs). Peer: ``opacus.accountants.utils.get_noise_multiplier(...,
  accountant="prv", epsilon_tolerance=1e-4, eps_error=2e-4 * eps)`` (its epsilon is an upper
  bound within ``eps_error``; the default 0.01 moves sigma by up to ~1%) and ``accountant="rdp"``;
  dpmf: ``dpmf.calibrate(Identity, PoissonSampling, eps, delta, "pld")`` (rel_tol 1e-4).
  Agreement: PRV within 1e-3 relative; RDP is looser, so its sigma must be >= dpmf's (and within
  15%).

(b) Correlated noise on the 1M-parameter model (dpmf only; the "peer" column is dpmf with
``Identity``, i.e. DP-SGD): ``noise_overhead_bsr4`` (``bsr(T, 4)``: 3 rows of history),
``noise_overhead_blt2`` and ``noise_overhead_blt4`` (``optimize_blt(T, buffers)``), Poisson q = 1/64,
sigma = 1, 3 warm-up + 20 timed steps. The plans use ``accountant="unamplified"`` (cheap, valid for
any strategy; the privacy of these runs is not the point). Reported: median step time of both, the
extra time per step, the median time of one ``noise.draw()`` alone (identity vs strategy, over the 23 steps),
and the noise state ``memory_floats * 4`` bytes (float32). Agreement: extra step time < 10% of the
identity step (goal), and ``memory_floats`` equals ``(bands - 1) d`` / ``buffers d``.

Standalone: ``PYTHONPATH=/tmp/opacus_site python benchmarks/bench_torch_training.py [--repeats 3]``
prints the same cases as a markdown table with the per-step numbers; ``benchmarks/run.py --only
torch_training`` runs them in the common harness (whole-call times there include ``make_private``).
"""

from __future__ import annotations

import math
import statistics
import time
import warnings

from case import Case

DELTA = 1e-5
CLIP = 1.0
SIGMA_Q = 1 / 23
SIGMA_STEPS = 460


# --------------------------------------------------------------------------------------- setups
def _torch():
    import torch

    torch.set_num_threads(1)
    return torch


def _digits():
    torch = _torch()
    from sklearn.datasets import load_digits
    from sklearn.preprocessing import StandardScaler

    X, y = load_digits(return_X_y=True)
    X, y = X[:1437], y[:1437]  # the size of the example's 80% training split
    X = StandardScaler().fit_transform(X)
    data = torch.utils.data.TensorDataset(torch.tensor(X, dtype=torch.float32), torch.tensor(y))

    def model():
        return torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))

    return data, model


def _random_1m():
    torch = _torch()
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(4096, 784, generator=g), torch.randint(0, 10, (4096,), generator=g))

    def model():
        return torch.nn.Sequential(
            torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256), torch.nn.ReLU(),
            torch.nn.Linear(256, 10),
        )

    return data, model


SETUPS = {"digits": _digits, "1m": _random_1m}
STEPS = {"digits": (10, 100, 10, 10.0), "1m": (3, 20, 1, 1.0)}  # warm-up, timed, steps pooled for the std, sigma


def _timed_steps(loader, step, warmup: int, timed: int, params, pool: int):
    """Run ``warmup + timed`` steps; per-step seconds of the timed ones and the .grad of the last ``pool``."""
    times, grads = [], []
    it = iter(loader)
    for i in range(warmup + timed):
        t0 = time.perf_counter()
        x, y = next(it)
        step(x, y)
        dt = time.perf_counter() - t0
        if i >= warmup:
            times.append(dt)
        if i >= warmup + timed - pool:
            grads.append(_torch().cat([p.grad.detach().flatten().double() for p in params]))
    g = _torch().cat(grads)
    return times, float(g.std())


def _opacus_steps(setup: str):
    def run():
        torch = _torch()
        from opacus import PrivacyEngine

        data, make_model = SETUPS[setup]()
        warmup, timed, pool, sigma = STEPS[setup]
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        loader = torch.utils.data.DataLoader(data, batch_size=64)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = PrivacyEngine(accountant="prv")
            model, opt, loader = engine.make_private(
                module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=CLIP,
                poisson_sampling=True, grad_sample_mode="hooks",
            )
        crit = torch.nn.CrossEntropyLoss()

        def step(x, y):
            opt.zero_grad()
            crit(model(x), y).backward()
            opt.step()

        # Opacus' loader has len(data) / 64 batches per pass; chain passes for more steps
        def batches():
            while True:
                yield from loader

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            times, std = _timed_steps(batches(), step, warmup, timed, list(model.parameters()), pool)
        return {"times": times, "std": std, "expected_std": sigma * CLIP / opt.expected_batch_size,
                "q": 1 / len(loader), "expected_batch": opt.expected_batch_size}

    return run


def _dpmf_steps(setup: str, strategy_kind: str = "identity"):
    def run():
        torch = _torch()
        from dpmf.sampling import PoissonSampling
        from dpmf.training.torch import make_private

        data, make_model = SETUPS[setup]()
        warmup, timed, pool, sigma = STEPS[setup]
        T = warmup + timed
        q = 1 / math.ceil(len(data) / 64)  # what Opacus derives from DataLoader(batch_size=64)
        strategy, accountant = _strategy(strategy_kind, T)
        torch.manual_seed(0)
        model = make_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        model, opt, loader, privacy = make_private(
            model, opt, data, strategy=strategy, sampling=PoissonSampling(q, T), noise_multiplier=sigma,
            delta=DELTA, max_grad_norm=CLIP, loss_fn=torch.nn.functional.cross_entropy, seed=0,
            accountant=accountant,
        )

        def step(x, y):
            opt.zero_grad()
            opt.step(x, y)

        times, std = _timed_steps(loader, step, warmup, timed, opt.params, pool)
        out = {"times": times, "std": std, "expected_std": sigma * CLIP / privacy.run_spec.normalizer, "q": q,
               "expected_batch": privacy.run_spec.normalizer, "memory_floats": opt.noise.memory_floats,
               "numel": opt.noise.numel, "draw": _draw_time(strategy_kind, T, opt.params, sigma)}
        return out

    return run


def _strategy(kind: str, T: int):
    from dpmf.strategies import BLTStrategy, Identity, bsr, optimize_blt

    if kind == "identity":
        return Identity(T), "pld"
    if kind == "bsr4":
        return bsr(T, 4), "unamplified"
    if kind.startswith("blt"):
        blt, _ = optimize_blt(T, int(kind[3:]), 1)
        return BLTStrategy.from_blt(blt, T), "unamplified"
    raise ValueError(kind)


def _draw_time(kind: str, T: int, params, sigma: float) -> float:
    """Median seconds of one ``noise.draw()`` over the ``T`` steps of a fresh generator (first 3 dropped)."""
    from dpmf.training.torch import correlated_noise

    strategy, _ = _strategy(kind, T)
    noise = correlated_noise(strategy, list(params), noise_multiplier=sigma, max_grad_norm=CLIP, seed=1)
    times = []
    for _ in range(T):
        t0 = time.perf_counter()
        noise.draw()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[3:])


def _compare_steps(tol: float):
    def compare(peer, ours) -> tuple[bool, str]:
        mp, mo = statistics.median(peer["times"]), statistics.median(ours["times"])
        rel_p = peer["std"] / peer["expected_std"] - 1
        rel_o = ours["std"] / ours["expected_std"] - 1
        ok = abs(rel_p) <= tol and abs(rel_o) <= tol and peer["q"] == ours["q"]
        return ok, (
            f"step median opacus {1e3 * mp:.2f} ms, dpmf {1e3 * mo:.2f} ms, opacus/dpmf {mp / mo:.2f}x; "
            f"grad std vs sigma*C/B: opacus {rel_p:+.2%} (B={peer['expected_batch']}), "
            f"dpmf {rel_o:+.2%} (B={ours['expected_batch']:.2f}); q=1/{round(1 / ours['q'])}"
        )

    return compare


# ---------------------------------------------------------------------------------- calibration
def _opacus_sigma(eps: float, accountant: str):
    def run():
        import warnings

        from opacus.accountants.utils import get_noise_multiplier

        # PRV's epsilon is an upper bound within eps_error; its default 0.01 (1e-3 at epsilon 1)
        # alone moves sigma by up to 1e-3, so ask for 2e-4 relative (26 s instead of 4.5 s at eps 1)
        kw = {"eps_error": 2e-4 * eps} if accountant == "prv" else {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return get_noise_multiplier(target_epsilon=eps, target_delta=DELTA, sample_rate=SIGMA_Q,
                                        steps=SIGMA_STEPS, accountant=accountant, epsilon_tolerance=1e-4, **kw)

    return run


def _dpmf_sigma(eps: float):
    def run():
        import dpmf
        from dpmf.sampling import PoissonSampling
        from dpmf.strategies import Identity

        return dpmf.calibrate(Identity(SIGMA_STEPS), PoissonSampling(SIGMA_Q, SIGMA_STEPS), eps, DELTA, "pld")

    return run


def _compare_sigma(eps: float, accountant: str):
    def compare(peer_sigma, cal) -> tuple[bool, str]:
        ours = cal.noise_multiplier
        rel = ours / peer_sigma - 1
        if accountant == "prv":
            ok = abs(rel) <= 1e-3 and cal.report.epsilon <= eps
        else:
            ok = ours <= peer_sigma and abs(rel) <= 0.15 and cal.report.epsilon <= eps
        return ok, f"sigma dpmf={ours:.5f} opacus-{accountant}={peer_sigma:.5f} rel {rel:+.2e}; dpmf eps={cal.report.epsilon:.5f}"

    return compare


# ----------------------------------------------------------------------------- noise overhead
def _compare_overhead(kind: str):
    def compare(ident, ours) -> tuple[bool, str]:
        mi, mo = statistics.median(ident["times"]), statistics.median(ours["times"])
        extra = mo - mi
        d = ours["numel"]
        rows = {"bsr4": 3, "blt2": 2, "blt4": 4}[kind]
        ok = extra / mi < 0.10 and ours["memory_floats"] == rows * d
        draw_extra = ours["draw"] - ident["draw"]
        return ok, (
            f"step identity {1e3 * mi:.1f} ms, {kind} {1e3 * mo:.1f} ms, extra {1e3 * extra:+.1f} ms "
            f"({extra / mi:+.1%}); noise.draw identity {1e3 * ident['draw']:.2f} ms, {kind} "
            f"{1e3 * ours['draw']:.2f} ms (+{1e3 * draw_extra:.2f} ms = {draw_extra / mi:.1%} of a step); "
            f"noise state {ours['memory_floats']} floats = {4 * ours['memory_floats'] / 2**20:.1f} MiB (d = {d})"
        )

    return compare


CASES = [
    Case("torch_step_digits", _opacus_steps("digits"), _dpmf_steps("digits"), _compare_steps(0.03),
         "per-step medians; .grad std within 3% of sigma*C/B on both sides, same q", peer_name="opacus"),
    Case("torch_step_1m", _opacus_steps("1m"), _dpmf_steps("1m"), _compare_steps(0.01),
         "per-step medians; .grad std within 1% of sigma*C/B on both sides, same q", peer_name="opacus"),
    *[
        Case(f"sigma_prv_eps{e:g}", _opacus_sigma(e, "prv"), _dpmf_sigma(e), _compare_sigma(e, "prv"),
             "|sigma rel diff| <= 1e-3 and dpmf eps <= target", peer_name="opacus")
        for e in (1.0, 4.0, 8.0)
    ],
    Case("sigma_rdp_eps4", _opacus_sigma(4.0, "rdp"), _dpmf_sigma(4.0), _compare_sigma(4.0, "rdp"),
         "RDP (looser) sigma >= dpmf's and within 15%", peer_name="opacus"),
    *[
        Case(f"noise_overhead_{k}", _dpmf_steps("1m", "identity"), _dpmf_steps("1m", k), _compare_overhead(k),
             "extra step time < 10% of the identity step; memory_floats = rows * d", peer_name="dpmf identity")
        for k in ("bsr4", "blt2", "blt4")
    ],
]


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="dpmf vs Opacus training steps and correlated-noise overhead")
    p.add_argument("--repeats", type=int, default=3, help="runs per side and case (alternating); medians")
    p.add_argument("--only", default=None, help="cases whose name contains this")
    args = p.parse_args(argv)
    print("| case | peer | peer s | dpmf s | agreement |")
    print("|---|---|---:|---:|---|")
    failed = 0
    for case in CASES:
        if args.only and args.only not in case.name:
            continue
        peer_t, ours_t, peer_r, ours_r = [], [], [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            peer_r.append(case.peer())
            peer_t.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ours_r.append(case.dpmf())
            ours_t.append(time.perf_counter() - t0)
        if isinstance(peer_r[0], dict):  # step cases: pool the timed steps of all repeats
            merge = lambda rs: {**rs[-1], "times": [t for r in rs for t in r["times"]],  # noqa: E731
                                **({"draw": statistics.median(r["draw"] for r in rs)} if "draw" in rs[-1] else {})}
            peer_res, ours_res = merge(peer_r), merge(ours_r)
        else:
            peer_res, ours_res = peer_r[-1], ours_r[-1]
        ok, detail = case.compare(peer_res, ours_res)
        failed += not ok
        print(f"| `{case.name}` | {case.peer_name} | {statistics.median(peer_t):.2f} | {statistics.median(ours_t):.2f} | "
              f"{'ok' if ok else '**FAIL**'}: {detail} |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
