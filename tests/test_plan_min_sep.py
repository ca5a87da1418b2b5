"""b-min-sep in the default plan (issue 49 item 2): BandMF under b-min-sep sampling is a candidate
of every plan where it fits (min-sep = bands, and twice the bands where that fits), ranked by the
only proved bound that finishes in seconds -- the unamplified min-sep sensitivity bound -- and
labelled so (the note names the bound and what certifying Algorithm 5 would cost); a row trained
with ``make_private(plan=row)`` samples b-min-sep batches and its report passes ``dpmf verify``."""

from __future__ import annotations

import math

import pytest

import dpmf
from dpmf.planner import TrainingRun, candidates, evaluate
from dpmf.planning.candidates import band_sweep, min_sep_values
from dpmf.planning.legend import legend_lines
from dpmf.sampling import MinSepSampling


def min_sep_candidates(run):
    return [c for c in candidates(run) if isinstance(c.scheme, MinSepSampling)]


def test_the_default_plan_has_bandmf_under_b_min_sep_for_each_band_count_and_min_sep():
    run = TrainingRun()  # 50,000 examples, batch 500: q = 0.01, 100 steps per epoch
    cands = min_sep_candidates(run)
    got = {(c.spec.bands, c.scheme.min_sep) for c in cands}
    assert got == {(4, 4), (4, 8), (16, 16), (16, 32), (64, 64)}  # 128 does not fit in an epoch of 100 steps
    for c in cands:
        assert c.spec.kind == "banded-toeplitz" and c.method == "unamplified" and c.wave == 0
        assert c.scheme.warm_start and math.isclose(c.scheme.participation_rate, run.sampling_prob)
        assert c.sampling_name == f"b-min-sep-{c.scheme.min_sep}"
    assert not min_sep_candidates(TrainingRun(1000, 500, 2))  # 2 steps per epoch: no min-sep fits


def test_min_sep_values_stay_where_an_example_can_still_be_drawn():
    run = TrainingRun(1000, 100, 3)  # q = 0.1, 10 steps per epoch
    for b in band_sweep(run):
        for m in min_sep_values(run, b):
            assert m * run.sampling_prob < 1 and 1 < m < run.steps_per_epoch


def test_a_b_min_sep_row_is_certified_by_the_sensitivity_bound_and_says_so():
    run = TrainingRun(5000, 100, 2, 2.0, 1e-6)
    cand = next(c for c in min_sep_candidates(run) if c.scheme.min_sep == c.spec.bands == 16)
    row = evaluate(cand, run)
    assert row.certified and not row.pruned and row.method == "unamplified"
    assert "min-sep sensitivity bound" in row.note and "Algorithm 5" in row.note and "samples" in row.note
    # the bound: ceil(n / min-sep) participations, recomputed by the library's accountant
    strategy, scheme, sigma = row.build()
    rep = dpmf.account(strategy, scheme, sigma, run.delta, method="unamplified")
    assert rep.epsilon == row.epsilon <= run.epsilon
    assert rep.diagnostics["participation"] == {"max_participations": -(-run.steps // 16), "min_sep": 16}
    assert "b-min-sep" in "\n".join(legend_lines([row]))
    # a Monte Carlo row of the same scheme would be an estimate: the plan ranks none by default
    assert all(c.method != "montecarlo" for c in candidates(run))


@pytest.mark.parametrize("epochs", [2])
def test_a_b_min_sep_row_trains_with_its_sampler_and_its_report_verifies(epochs):
    torch = pytest.importorskip("torch")
    from dpmf.accounting.verify import verify_report
    from dpmf.training.torch import make_private

    run = TrainingRun(120, 20, epochs, 2.0, 1e-5)  # 6 steps per epoch: b-min-sep-4 under 4 bands
    cand = next(c for c in min_sep_candidates(run))
    row = evaluate(cand, run)
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(120, 6, generator=g), torch.randint(0, 2, (120,), generator=g))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model, opt, loader, privacy = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data, plan=row,
                                               max_grad_norm=1.0, seed=0)
    assert isinstance(privacy.run_spec.scheme, MinSepSampling) and privacy.run_spec.scheme.min_sep == cand.scheme.min_sep
    sampler = loader.batch_sampler
    assert sampler.scheme.describe() == cand.scheme.describe()
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    import numpy as np

    last: dict[int, int] = {}
    batches = list(sampler.scheme.batches(120, np.random.default_rng(sampler.seed)))  # (the loader's, line for line)
    assert len(batches) == run.steps and sum(len(b) for b in batches) > 0
    for t, batch in enumerate(batches):  # two participations at least min-sep apart
        for i in batch:
            assert t - last.get(int(i), -10**9) >= cand.scheme.min_sep
            last[int(i)] = t
    report = privacy.report()
    assert privacy.steps_done == run.steps
    assert report.scheme["name"] == "b-min-sep" and report.scheme["min_sep"] == cand.scheme.min_sep
    v = verify_report(report.to_json())
    assert v.holds and v.edited is False and v.recomputed_epsilon == row.epsilon
