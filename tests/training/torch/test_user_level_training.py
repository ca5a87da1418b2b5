"""User-level training end to end: bound contributions, make_private with the multi-attribution
scheme and the bounded graph, the loader's batches are the scheme's draws for the seed and respect
users, the report is user level, one-example users give the example-level epsilon, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpmf.accounting.report import USER_ADJACENCY
from dpmf.errors import InvalidParameterError
from dpmf.sampling import (
    MinSepSampling,
    MultiAttributionMinSepSampling,
    attribution_from_edges,
    bound_contributions,
)
from dpmf.strategies import bsr
from dpmf.training.torch import make_private
from dpmf.training.torch.engine import _derived_seed

LOSS = torch.nn.functional.cross_entropy
STEPS, B = 8, 2


def _graph(m=150, users=60, extra=80, seed=0):
    rng = np.random.default_rng(seed)
    ex = np.concatenate([np.arange(m), rng.integers(0, m, extra)])
    us = rng.integers(0, users, ex.size)
    return attribution_from_edges(ex, us)


def _dataset(m):
    # feature 0 is the example's index, so the loader's batches can be read back
    x = torch.cat([torch.arange(m, dtype=torch.float64)[:, None], torch.randn(m, 3, dtype=torch.float64)], 1)
    return torch.utils.data.TensorDataset(x, torch.randint(0, 3, (m,)))


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3).double()

    def forward(self, x):
        return self.lin(x[:, 1:])


def _make(scheme, att, m, *, seed=5, delta=1e-5, **kw):
    model = _Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    kw.setdefault("noise_multiplier", 2.0)
    kw.setdefault("accountant", "unamplified")
    return make_private(model, opt, _dataset(m), strategy=bsr(STEPS, B), sampling=scheme, delta=delta,
                        max_grad_norm=1.0, loss_fn=LOSS, seed=seed, attribution=att, **kw)


def test_bounded_graph_trains_with_the_schemes_batches():
    res = bound_contributions(_graph(), 2, seed=0)
    att, m = res.attribution, res.report.kept_examples
    scheme = res.scheme(0.05, STEPS, B, warmup_steps=4)
    run = _make(scheme, att, m)
    want = list(scheme.batches(att, np.random.default_rng(_derived_seed(5, 0))))  # the scheme's draws, same seed
    got = []
    for x, y in run.data_loader:
        got.append(x[:, 0].long().tolist())
        run.optimizer.zero_grad()
        run.optimizer.step(x, y)
    assert got == [b.tolist() for b in want] and sum(map(len, got)) > 0
    # users respect min_sep: no user in two batches closer than B steps
    last: dict = {}
    for t, batch in enumerate(got):
        for e in batch:
            for u in att.user_of[att.example_ptr[e]: att.example_ptr[e + 1]]:
                assert t - last.get(u, -B) >= B
        for e in batch:
            for u in att.user_of[att.example_ptr[e]: att.example_ptr[e + 1]]:
                last[u] = t
    rep = run.privacy.report()
    assert rep.certified and rep.adjacency == USER_ADJACENCY
    assert rep.scheme["max_user_examples"] == 2 and run.privacy.steps_done == STEPS


def test_one_example_per_user_gives_the_example_level_epsilon():
    m = 100
    att = attribution_from_edges(np.arange(m), np.arange(m) + 1000)  # every user has exactly one example
    res = bound_contributions(att, 3, seed=0)
    assert res.max_user_examples == 1 and res.report.kept_examples == m
    user = _make(res.scheme(0.1, STEPS, B), res.attribution, m)
    example = _make(MinSepSampling(0.1, STEPS, B), None, m)
    assert user.privacy.report().epsilon == example.privacy.report().epsilon
    assert user.privacy.report().adjacency == USER_ADJACENCY != example.privacy.report().adjacency


def test_refusals_before_accounting():
    res = bound_contributions(_graph(), 2, seed=0)
    m = res.report.kept_examples
    scheme = res.scheme(0.05, STEPS, B)
    with pytest.raises(InvalidParameterError, match="attribution is required"):
        _make(scheme, None, m)
    with pytest.raises(InvalidParameterError, match="differs from the attribution"):
        _make(scheme, res.attribution, m + 1)
    with pytest.raises(InvalidParameterError, match="max_user_examples=1"):
        _make(MultiAttributionMinSepSampling(0.05, STEPS, B, 1), res.attribution, m)  # graph not bounded to 1
    with pytest.raises(InvalidParameterError, match="only used by MultiAttributionMinSepSampling"):
        _make(MinSepSampling(0.1, STEPS, B), res.attribution, m)


@pytest.mark.slow
def test_certified_monte_carlo_user_level_run():
    res = bound_contributions(_graph(), 2, seed=0)
    scheme = res.scheme(0.05, STEPS, B, warmup_steps=4)
    run = _make(scheme, res.attribution, res.report.kept_examples, noise_multiplier=None, target_epsilon=8.0, delta=1e-3,
                accountant="montecarlo", accountant_options={"seed": 1})
    rep = run.privacy.report()
    assert rep.certified and rep.method == "montecarlo-evr" and rep.epsilon <= 8.0
    assert rep.adjacency == USER_ADJACENCY


@pytest.mark.slow
def test_the_example_runs(tmp_path):
    """examples/user_level_stdlib.py end to end (~1 min with imports): bounded, calibrated, trained,
    certified user-level report, a labelled Monte Carlo estimate."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "user_level_stdlib.py"
    out = tmp_path / "ul.json"
    proc = subprocess.run([sys.executable, str(example), "--mc-samples", "5000", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    b = res["bounding"]
    assert b["kept_examples"] + sum(b["dropped"].values()) == b["examples"] and b["max_user_examples"] <= 4
    assert abs(res["sampling"]["batch_size"] / res["sampling"]["target_batch_size"] - 1) < 0.01
    assert res["training"]["steps"] == 16 and res["training"]["bits_after"] < res["training"]["bits_before"]
    assert res["report"]["certified"] and res["report"]["adjacency"] == USER_ADJACENCY
    assert res["montecarlo_estimate"]["certified"] is False
    assert "ESTIMATE" in proc.stdout and "user-level guarantee" in proc.stdout
