"""The training run's report (issue 24 items 13 and 14): it states the adjacency, and its saved JSON
carries the digest, so ``dpmf verify`` accepts it unedited and flags an edit."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from dpmf.accounting.report import ADJACENCY
from dpmf.accounting.verify import verify_report
from dpmf.cli.main import app
from dpmf.sampling import PoissonSampling
from dpmf.strategies import Identity
from dpmf.training.torch import make_private


def _report():
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(40, 4, generator=g), torch.randint(0, 2, (40,), generator=g))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    run = make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), data, strategy=Identity(4),
                       sampling=PoissonSampling(0.25, 4), noise_multiplier=2.0, delta=1e-5, max_grad_norm=1.0,
                       loss_fn=torch.nn.functional.cross_entropy, seed=0)
    for t, (x, y) in enumerate(run.data_loader):
        if t == 2:
            break
        run.optimizer.zero_grad()
        run.optimizer.step(x, y)
    return run.privacy.report()


def test_training_report_states_adjacency_and_verifies_unedited(tmp_path):
    r = _report()
    assert r.adjacency == ADJACENCY and ADJACENCY in r.summary() and ADJACENCY in str(r)
    assert "len(dataset)" in r.summary() and "normalizer=" in r.summary()
    saved = json.loads(r.to_json())
    assert saved["adjacency"] == ADJACENCY and saved["diagnostics"]["training"]["steps_done"] == 2
    v = verify_report(saved)
    assert v.holds and v.edited is False

    runner = CliRunner()
    path = tmp_path / "training-report.json"
    path.write_text(r.to_json(indent=2))
    res = runner.invoke(app, ["verify", str(path)])
    assert res.exit_code == 0, res.output
    assert "NOT EDITED" in res.stdout

    saved["diagnostics"]["training"]["num_examples"] = 4000  # the run's description edited
    path.write_text(json.dumps(saved))
    res = runner.invoke(app, ["verify", str(path)])
    assert res.exit_code == 3, res.output
    assert res.stdout.startswith("HOLDS") and "EDITED since it was produced" in res.stdout
