"""Paper 001 (Dong & Ganesh, b-min-sep subsampling for BandMF): the MSE-ratio grids of Figs. 2-3
(n = 1024, delta = 1e-3) and the b-min-sep vs cyclic Poisson epsilon-vs-sigma comparison (Sec. 4.1).

For each epoch length E = |D|/B (rate p0 = 1/E) and number of bands, the banded Toeplitz encoder is
``dpmf.strategies.optimize_banded_toeplitz(1024, bands)`` (prefix-sum MSE without amplification, unit
column norm, as the paper's ref. [9]). Epsilon at a grid of sigma is computed for
* cyclic Poisson (b = bands, q = bands p0): exact PLD, ``dpmf.account(..., method="mmcc")`` (the
  generalized-MMCC reduction to ceil(n/b) subsampled Gaussians);
* warm-start b-min-sep (b = bands) and balls-in-bins (E steps per epoch): Monte Carlo estimates,
  ``account_montecarlo`` (99% upper confidence bound; the sample count is stated on the page);
then sigma(epsilon) is interpolated in log-log and MSE = (prefix-sum RMSE per unit sigma x sigma)^2.
The paper calibrates with Algorithm 5 instead (certified, at delta/2); both are estimates of the same
curve, ours is not certified.

    python benchmarks/papers/paper001_bminsep.py [--fast] [--out DIR]
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from _common import Report, main_guard, new_figure, parse_args

import dpmf
from dpmf.accounting.montecarlo.accountant import account_montecarlo
from dpmf.sampling import BallsInBinsSampling, CyclicPoissonSampling, MinSepSampling, PoissonSampling
from dpmf.strategies import Identity, optimize_banded_toeplitz

N, DELTA = 1024, 1e-3
SRC2 = "Fig. 2 and Sec. 7.1 (html: no pages)"
SRC3 = "Fig. 3 and Sec. 7.1 (html: no pages)"


def sigma_at(eps_target: float, sigmas, eps) -> float:
    """Interpolate sigma(epsilon) in log-log from epsilon computed on a sigma grid (monotone)."""
    e = np.asarray(eps, float)
    s = np.asarray(sigmas, float)
    ok = np.isfinite(e) & (e > 0)
    e, s = e[ok], s[ok]
    order = np.argsort(e)
    le, ls = np.log(e[order]), np.log(s[order])
    x = math.log(eps_target)
    if x < le[0] or x > le[-1]:  # extrapolate linearly from the two nearest points
        i = 0 if x < le[0] else len(le) - 2
        return float(math.exp(ls[i] + (ls[i + 1] - ls[i]) * (x - le[i]) / (le[i + 1] - le[i])))
    return float(math.exp(np.interp(x, le, ls)))


def main(argv: Sequence[str] | None = None) -> Report:
    args = parse_args(argv, __doc__)
    fast = args.fast
    rep = Report("001", "b-min-sep subsampling for BandMF (Figs. 2-3, Sec. 4.1)", "paper001_bminsep.py", fast,
                 out=args.out)
    epochs_len = [256] if fast else [128, 256, 512, 1024]
    bands_list = [4] if fast else [2, 4, 8, 16, 32]
    eps_list = [1.0, 4.0] if fast else [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]
    samples = 10_000 if fast else 30_000
    mult = [0.6, 1.2, 3.0] if fast else [0.4, 0.6, 0.9, 1.4, 2.2, 3.5]
    rep.full_mode_estimate = (
        f"epoch lengths {{128, 256, 512, 1024}} x bands {{2, 4, 8, 16, 32}} x 6 sigma points, "
        f"2 Monte Carlo runs per point with 30,000 samples (the paper's Alg. 5 recipe needs 75,013 per "
        f"verification at delta = 1e-3): ~240 Monte Carlo runs of ~5 s plus 120 PLD runs of ~3 s, about 30-40 "
        f"minutes of CPU; not run today (the machine was shared), the page shows the fast-mode slice.")
    rep.setup = [
        f"n = {N} iterations, delta = 1e-3, epoch length E = |D|/B (rate p0 = 1/E), bands in {bands_list}, "
        f"epsilon in {eps_list}.",
        f"Monte Carlo: {samples:,} samples per direction and sigma, seed 1, epsilon from the 99% upper confidence "
        "bound on delta (an estimate, certified=False).",
        "b-min-sep uses b = bands; its best MSE also allows b = E, which with warm start and p = 1 IS balls-in-bins "
        "(Sec. 4), so MSE(b-min-sep) <= MSE(balls-in-bins) holds by construction, as in the paper.",
        "Cyclic Poisson: b = bands, q = bands x p0, exact PLD accounting.",
    ]
    grid = {}  # (E, bands) -> dict of method -> (sigmas, eps)
    rmse = {}
    for E in epochs_len:
        p0 = 1.0 / E
        for bands in bands_list:
            if bands > E:
                continue
            strat = rep.timed("optimize C", lambda: optimize_banded_toeplitz(N, bands))
            rmse[(E, bands)] = strat.prefix_sum_rmse()
            sig = [m * math.sqrt(N * p0 / 4) for m in mult]  # scale with sqrt(expected participations)
            sig = [max(s, 0.3) for s in sig]
            cyc, bms, bib = [], [], []
            for s in sig:
                cyc.append(rep.timed("cyclic PLD", lambda: dpmf.account(
                    strat, CyclicPoissonSampling(bands * p0, N, bands), s, DELTA, method="mmcc").epsilon))
                ms = MinSepSampling.from_participation_rate(p0, N, bands, warm_start=True)
                bms.append(rep.timed("Monte Carlo", lambda: account_montecarlo(
                    strat, ms, s, DELTA, num_samples=samples, seed=1).epsilon))
                bib.append(rep.timed("Monte Carlo", lambda: account_montecarlo(
                    strat, BallsInBinsSampling(N // E, N), s, DELTA, num_samples=samples, seed=1).epsilon))
            grid[(E, bands)] = {"sigmas": sig, "cyclic": cyc, "bminsep": bms, "bib": bib}

    def best_mse(E, eps, method):
        vals = []
        for (E2, bands), d in grid.items():
            if E2 != E:
                continue
            meths = ("bminsep", "bib") if method == "bminsep" else (method,)
            for m in meths:
                vals.append((rmse[(E, bands)] * sigma_at(eps, d["sigmas"], d[m])) ** 2)
        return min(vals)

    ratio_c = np.array([[best_mse(E, e, "bminsep") / best_mse(E, e, "cyclic") for e in eps_list] for E in epochs_len])
    ratio_b = np.array([[best_mse(E, e, "bminsep") / best_mse(E, e, "bib") for e in eps_list] for E in epochs_len])
    fig, axes = new_figure(2, width=4.6)
    for ax, R, title in ((axes[0, 0], ratio_c, "MSE(b-min-sep) / MSE(cyclic Poisson)"),
                         (axes[0, 1], ratio_b, "MSE(b-min-sep) / MSE(balls-in-bins)")):
        im = ax.imshow(R, cmap="coolwarm", vmin=0.5, vmax=1.5, origin="lower")
        ax.set_xticks(range(len(eps_list)), [f"{e:g}" for e in eps_list])
        ax.set_yticks(range(len(epochs_len)), [str(E) for E in epochs_len])
        ax.set_xlabel("epsilon")
        ax.set_ylabel("epoch length |D|/B")
        ax.set_title(title, fontsize=8)
        for i in range(R.shape[0]):
            for j in range(R.shape[1]):
                ax.text(j, i, f"{R[i, j]:.2f}", ha="center", va="center", fontsize=7)
    fig.colorbar(im, ax=axes[0, :].tolist(), shrink=0.8)
    rep.figure(fig, "figs2_3", f"Figs. 2-3 redrawn (n = 1024, delta = 1e-3, bands {bands_list}, Monte Carlo with "
                               f"{samples:,} samples): < 1 means b-min-sep has the lower MSE.")
    cells = "; ".join(f"E={E}, eps={e:g}: {ratio_c[i, j]:.3f}" for i, E in enumerate(epochs_len)
                      for j, e in enumerate(eps_list))
    big = [(i, j) for i, E in enumerate(epochs_len) for j, e in enumerate(eps_list) if e >= 4 or E >= 512]
    rep.claim("fig2_improves", "MSE ratio vs cyclic Poisson", SRC2,
              "'meaningful improvements ... except when both epsilon and epoch length are low'",
              bool(big) and all(ratio_c[i, j] < 1 for i, j in big), cells,
              explain=f"Monte Carlo noise at {samples:,} samples moves sigma by a few percent")
    rep.claim("fig3_never_above_1", "MSE ratio vs balls-in-bins", SRC3,
              "ratios are never > 1 (|D|/B-min-sep retrieves balls-in-bins)", bool(np.all(ratio_b <= 1 + 1e-12)),
              "; ".join(f"E={E}, eps={e:g}: {ratio_b[i, j]:.3f}" for i, E in enumerate(epochs_len)
                        for j, e in enumerate(eps_list)))

    # ---- Sec. 4.1: b-min-sep vs cyclic Poisson, epsilon vs sigma at matched rate
    E, bands = epochs_len[0], bands_list[0]
    d = grid[(E, bands)]
    fig, ax = new_figure()
    ax[0, 0].loglog(d["sigmas"], d["cyclic"], "o-", label=f"cyclic Poisson (b={bands}, exact PLD)")
    ax[0, 0].loglog(d["sigmas"], d["bminsep"], "s--", label=f"b-min-sep (b={bands}, Monte Carlo)")
    ax[0, 0].loglog(d["sigmas"], d["bib"], "^:", label=f"balls-in-bins (E={E}, Monte Carlo)")
    ax[0, 0].set_xlabel("noise multiplier sigma")
    ax[0, 0].set_ylabel("epsilon @ delta = 1e-3")
    ax[0, 0].legend(fontsize=7)
    rep.figure(fig, "sec41", f"Sec. 4.1 comparison: epsilon vs sigma at the same rate p0 = 1/{E}, "
                             f"{bands}-banded optimized C, n = 1024.")
    pairs = list(zip(d["sigmas"], d["cyclic"], d["bminsep"]))
    rep.claim("sec41_small_sigma", "b-min-sep vs cyclic Poisson at small sigma", "Sec. 4.1",
              "b-min-sep is strictly better as sigma -> 0 (participation-count variance x (1 - p0 (b-1)))",
              pairs[0][2] < pairs[0][1], f"sigma={pairs[0][0]:.2f}: b-min-sep {pairs[0][2]:.3f} vs cyclic {pairs[0][1]:.3f}",
              explain="Monte Carlo estimate (upper confidence bound) against an exact PLD")
    rel = [abs(b - c) / c for _, c, b in pairs]
    rep.claim("sec41_large_sigma", "b-min-sep vs cyclic Poisson as sigma grows", "Sec. 4.1",
              "both converge to the same first-order term as sigma -> inf",
              rel[-1] < rel[0] or rel[-1] < 0.1,
              "relative gap |b-min-sep - cyclic| / cyclic: " + ", ".join(f"sigma={s:.2f}: {r:.3f}"
                                                                         for (s, _, _), r in zip(pairs, rel)))

    # ---- production numbers (Sec. 7.4)
    if not fast:
        q = 1793 / 14_745_600
        cal = rep.timed("Sec. 7.4 DP-SGD", lambda: dpmf.calibrate(Identity(7200), PoissonSampling(q, 7200), 10.0,
                                                                   1.301e-8, rel_tol=1e-3))
        rep.numeric("sec74_dpsgd_sigma", "DP-SGD noise for (10, 1.301e-8), 7200 Poisson steps, batch 1793 of "
                    "14,745,600", "Sec. 7.4", "0.368", cal.noise_multiplier, tol=0.0015,
                    explain="'≈0.368' in the text; dpmf's connect-the-dots PLD calibration at rel_tol 1e-3")
    else:
        rep.not_reproduced("sec74_dpsgd_sigma", "DP-SGD noise for (10, 1.301e-8), 7200 Poisson steps", "Sec. 7.4",
                           "0.368", "full mode only (7200-step PLD calibration)")
    sec74_truncated(rep, fast)
    rep.not_reproduced("sec74_production", "production 256-BandMF: b-min-sep sigma 0.47 (25% below cyclic Poisson)",
                       "Sec. 7.4", "0.47 (25% reduction)",
                       "the production encoder C is confidential and the b-min-sep run used 7.5e9 Monte Carlo "
                       "samples per verification (300 CPU-days)")
    rep.not_reproduced("fig4_5_training", "CINIC-10 / arXiv training accuracy and loss", "Figs. 4-5",
                       "curves (no numbers in the text)", "needs the training runs (VGG on CINIC-10, TinyBERT)")
    rep.write()
    return rep


def sec74_truncated(rep: Report, fast: bool) -> None:
    """Sec. 7.4's baseline: 256-BandMF under truncated and padded cyclic Poisson (7200 steps, expected
    batch 1793, max 2048, 14,745,600 examples, (10, 1.301e-8)); the paper reports sigma ~ 0.627."""
    m, b, steps, B = 14_745_600, 256, 7200, 2048
    delta = m ** -1.1  # 1.3016e-8: the paper's "~1.301e-8" is m^(-1.1)
    q = 1793 * b / m  # per-active-step probability of cyclic Poisson (expected batch q m / b = 1793)
    scheme = CyclicPoissonSampling(q, steps, b, max_batch_size=B, dataset_size=m)
    # Any 256-banded C >= 0 with unit column norm gives the same report as the identity here (the
    # accountant only reads the largest column norm: 29 rounds of the target's group, disjoint blocks).
    strategy, disc = Identity(steps), 1e-3  # (1e-3: the sensitivity-3 branch's grid at sigma ~ 0.57)
    at_pub = rep.timed("Sec. 7.4 truncated cyclic Poisson", lambda: dpmf.account(
        strategy, scheme, 0.627, delta, method="truncated_pld", discretization=disc))
    rep.claim("sec74_trunc_sound", "sigma 0.627 certifies (10, 1.301e-8) for truncated cyclic Poisson",
              "Sec. 7.4", "sigma ~ 0.627 gives (10, ~1.301e-8)", at_pub.epsilon <= 10.0,
              f"dpmf truncated_pld: epsilon {at_pub.epsilon:.3f} at sigma 0.627 (truncation probability per round "
              f"<= {at_pub.diagnostics['truncation_probability_bound']:.3g}, {at_pub.diagnostics['rounds']} rounds, "
              f"pool {at_pub.diagnostics['pool']})")
    tol = 5e-3 if fast else 1e-3
    cal = rep.timed("Sec. 7.4 truncated cyclic Poisson", lambda: dpmf.calibrate(
        strategy, scheme, 10.0, delta, method="truncated_pld", discretization=disc, rel_tol=tol))
    rounds = -(-steps // b)  # the untruncated cyclic reduction: 29 subsampled Gaussians (= MMCC for banded C)
    untr = rep.timed("Sec. 7.4 truncated cyclic Poisson", lambda: dpmf.calibrate(
        Identity(rounds), PoissonSampling(q, rounds), 10.0, delta, method="pld", rel_tol=tol))
    hyp = rep.timed("Sec. 7.4 hypotheses (dp_accounting)", lambda: sec74_hypotheses(m, b, q, delta, rounds, B))
    rep.numeric("sec74_trunc_sigma", "noise multiplier of the truncated cyclic Poisson baseline", "Sec. 7.4",
                "0.627", cal.noise_multiplier, tol=0.0005,
                note=(f"calibrated to rel_tol {tol:g} at discretization {disc:g}. dpmf's sound truncated analysis needs "
                      "less noise than the paper reports; the paper does not say how 0.627 was accounted. Untruncated "
                      f"cyclic Poisson (MMCC = ceil(7200/256) = 29 subsampled Gaussians) needs {untr.noise_multiplier:.4f}; "
                      "truncation at 2048 happens with probability ~1.1e-9 per round, so an analysis that reveals the "
                      "truncation event adds almost nothing. None of the standard accounting variants gives 0.627 "
                      f"(replace-one {hyp['replace-one']:.4f}, RDP {hyp['rdp']:.4f}, 28 rounds {hyp['28 rounds']:.4f}); "
                      f"0.627 is the calibrated sigma only of an analysis ~{hyp['orders']:.1f} orders of magnitude more "
                      f"conservative in delta, or at epsilon {hyp['eps at 0.627']:.2f} (the section below)"))
    rows = hyp["rows"]
    rep.section("Sec. 7.4: the truncated cyclic Poisson baseline", "\n".join([
        "Noise multiplier for (10, m^-1.1 = 1.3016e-8), 7200 steps, cycle 256, expected batch 1793, max 2048, "
        "m = 14,745,600, unit column norm. The dp_accounting rows are hypotheses about how the published value "
        f"was obtained; each is computed by this script: dp_accounting {hyp['version']} on the {rounds}-round "
        "reduction (Poisson(q = 1793/57600) subsampled Gaussian, PLD at value_discretization_interval 1e-3, "
        "pessimistic; RDP at its default orders), sigma found by Brent's method to +-1e-4.",
        "",
        "| analysis | sigma |",
        "|---|---|",
        "| published (Sec. 7.4; its accounting is not stated) | 0.627 |",
        f"| dpmf truncated_pld (sound; truncation revealed, per-round bound <= "
        f"{cal.report.diagnostics['truncation_probability_bound']:.3g}) | {cal.noise_multiplier:.4f} |",
        f"| dpmf pld, untruncated cyclic Poisson (the {rounds}-round reduction) | {untr.noise_multiplier:.4f} |",
        *(f"| {label} | {value:.4f} |" for label, value in rows),
        "| delta + 29 x P[truncation] (Chua et al.'s additive route) | infeasible: 29 x 1.1e-9 > 1.3e-8 |",
        "",
        "Read backwards, the same 29-round add/remove PLD at sigma 0.627 gives epsilon "
        f"{hyp['eps at 0.627']:.2f} at the paper's delta, or epsilon 10 at delta {hyp['delta at 0.627']:.3g} "
        f"(delta / {delta / hyp['delta at 0.627']:.0f}, {hyp['orders']:.1f} orders of magnitude smaller), and it would "
        f"be the calibrated sigma for about {hyp['rounds at 0.627']} rounds instead of {rounds}.",
        "",
        "**Conclusion: not reproduced.** No standard variant -- add/remove or replace-one adjacency, PLD or RDP, "
        "truncated or untruncated, 28 or 29 rounds, or delta split in two -- gives 0.627: they span "
        f"{min(hyp['standard']):.4f}-{max(hyp['standard']):.4f}. {hyp['brackets']} It matches only an analysis about "
        f"{hyp['orders']:.1f} orders of magnitude more conservative in delta, or one at epsilon ~{hyp['eps at 0.627']:.1f}; "
        "the paper does not say which it used. dpmf's value is smaller and sound (truncation revealed, every "
        "discretization pessimistic).",
        "",
        f"A sigma of 0.627 is sound for this configuration (epsilon {at_pub.epsilon:.2f} under truncated_pld); it is not the "
        "smallest one. The paper's 25% reduction to 0.47 (b-min-sep) is measured against 0.627, so against "
        f"{cal.noise_multiplier:.3f} it would be {1 - 0.47 / cal.noise_multiplier:.0%}.",
    ]))


def sec74_hypotheses(m: int, b: int, q: float, delta: float, rounds: int, max_batch: int) -> dict:
    """Sec. 7.4's 0.627 against the accounting variants a reader might guess, all with dp_accounting (a
    core dependency) on the untruncated ``rounds``-round reduction: each row is the sigma at which that
    variant gives epsilon 10 (or the stated target), by Brent's method on epsilon(sigma) to xtol 1e-4;
    and sigma 0.627 read backwards (its epsilon at delta, its delta at epsilon 10, the rounds it fits)."""
    import dp_accounting as dpa
    from absl import logging as absl_logging
    from dp_accounting import pld, rdp
    from scipy.optimize import brentq

    absl_logging.set_verbosity(absl_logging.ERROR)  # RDP warns about fractional orders it skips
    rel = dpa.NeighboringRelation

    def event(sigma: float, r: int, truncated: bool = False):
        one = (dpa.TruncatedSubsampledGaussianDpEvent(m // b, q, max_batch, sigma) if truncated
               else dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(sigma)))
        return dpa.SelfComposedDpEvent(one, r)

    def accountant(kind: str, relation, sigma: float, r: int, truncated: bool = False):
        acc = (pld.PLDAccountant(neighboring_relation=relation, value_discretization_interval=1e-3) if kind == "pld"
               else rdp.RdpAccountant(neighboring_relation=relation))
        return acc.compose(event(sigma, r, truncated))

    def sigma_for(kind="pld", relation=rel.ADD_OR_REMOVE_ONE, r=rounds, eps=10.0, d=delta, truncated=False) -> float:
        return brentq(lambda s: accountant(kind, relation, s, r, truncated).get_epsilon(d) - eps, 0.45, 0.8, xtol=1e-4)

    add = f"dp_accounting PLD, add/remove, {rounds} rounds"
    out = {"replace-one": sigma_for(relation=rel.REPLACE_ONE), "rdp": sigma_for("rdp"),
           "28 rounds": sigma_for(r=rounds - 1), "version": getattr(dpa, "__version__", "")}
    if not out["version"]:
        from importlib.metadata import version

        out["version"] = version("dp-accounting")
    out["rows"] = [
        (add + " (dpmf's adjacency)", sigma_for()),
        (f"dp_accounting PLD, TruncatedSubsampledGaussianDpEvent (batch <= {max_batch}) x {rounds}",
         sigma_for(truncated=True)),
        (f"dp_accounting PLD, replace-one adjacency, {rounds} rounds", out["replace-one"]),
        (f"dp_accounting RDP, add/remove, {rounds} rounds", out["rdp"]),
        (f"dp_accounting RDP, replace-special adjacency, {rounds} rounds", sigma_for("rdp", rel.REPLACE_SPECIAL)),
        (f"dp_accounting PLD, add/remove, {rounds - 1} rounds (7200 / 256 rounded down)", out["28 rounds"]),
        *((f"{add}, epsilon 10 at delta / {f}", sigma_for(d=delta / f)) for f in (2, 10, 100, 1000)),
        *((f"{add}, epsilon {e} at delta", sigma_for(eps=e)) for e in (8, 9)),
    ]
    out["standard"] = [v for _, v in out["rows"][:7]]  # adjacency, RDP/PLD, truncation, rounds, delta / 2
    brackets = []
    for what, part in (("delta", out["rows"][6:10]), ("epsilon", out["rows"][10:])):
        pairs = [(a, b_) for a, b_ in zip(part, part[1:]) if min(a[1], b_[1]) <= 0.627 <= max(a[1], b_[1])]
        brackets += [f"0.627 lies between the rows '{la.rsplit(', ', 1)[-1]}' ({va:.4f}) and "
                     f"'{lb.rsplit(', ', 1)[-1]}' ({vb:.4f})." for (la, va), (lb, vb) in pairs]
        if not pairs:
            brackets.append(f"No two neighbouring {what} rows bracket 0.627.")
    out["brackets"] = " ".join(brackets)
    at = accountant("pld", rel.ADD_OR_REMOVE_ONE, 0.627, rounds)
    out["eps at 0.627"], out["delta at 0.627"] = at.get_epsilon(delta), at.get_delta(10.0)
    out["orders"] = math.log10(delta / out["delta at 0.627"])

    def eps_627(r: int) -> float:
        return accountant("pld", rel.ADD_OR_REMOVE_ONE, 0.627, r).get_epsilon(delta)

    lo, hi = rounds, 4 * rounds  # epsilon grows with the rounds: the last r where 0.627 still gives <= 10
    while eps_627(hi) <= 10:
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if eps_627(mid) <= 10 else (lo, mid)
    out["rounds at 0.627"] = lo
    return out


if __name__ == "__main__":
    main_guard(main)
