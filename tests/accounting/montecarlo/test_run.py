"""MonteCarloRun: reproducible chunks, atomic checkpoints, resume (also after SIGINT), Dask == local,
and the must-have oracle: b = 1 (Poisson DP-SGD) Monte Carlo delta(eps) agrees with the exact PLD."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from _dpsgd_sampler import dpsgd_loss_samples, gaussian_loss_samples
from dpmf.accounting.montecarlo.run import MonteCarloRun, chunk_generator, resume
from dpmf.errors import InvalidParameterError
from dpmf.privacy.gaussian_plds import subsampled_gaussian
from dpmf.sampling import MinSepSampling, PoissonSampling
from dpmf.strategies import Identity

HERE = Path(__file__).resolve().parent


def _run(num_samples=6000, chunk_size=1000, seed=7, **kw):
    return MonteCarloRun(
        Identity(10), PoissonSampling(0.1, 10), 1.0, num_samples, seed=seed, chunk_size=chunk_size,
        sampler=dpsgd_loss_samples, **kw,
    )


def test_b1_poisson_delta_agrees_with_pld_in_both_directions():
    q, steps, sigma = 0.1, 20, 1.0
    run = MonteCarloRun(
        Identity(steps), PoissonSampling(q, steps), sigma, 300_000, seed=11, chunk_size=50_000,
        sampler=dpsgd_loss_samples,
    ).run()
    pld = subsampled_gaussian(sigma, q).self_compose(steps)
    for eps in (0.25, 0.5, 1.0, 1.5):
        exact = pld.delta_by_direction(eps)
        for d in ("remove", "add"):
            if exact[d] < 1e-4:  # too rare for 3e5 samples to say anything useful
                continue
            lo, est, hi = run.histograms[d].delta_interval(eps, 0.999)
            assert lo <= exact[d] <= hi, (eps, d, lo, exact[d], hi)


@pytest.mark.parametrize("scheme", [PoissonSampling(0.1, 20), MinSepSampling(0.1, 20, 1)])
def test_b1_with_the_library_sampler_agrees_with_pld(scheme):
    # the same oracle through the default (part A) sampler: Poisson, and b-min-sep with b = 1
    pytest.importorskip("dpmf.accounting.montecarlo.losses")
    run = MonteCarloRun(Identity(20), scheme, 1.0, 200_000, seed=12, chunk_size=50_000).run()
    assert run.sampler_name == "dpmf.accounting.montecarlo.losses:privacy_loss_samples"
    pld = subsampled_gaussian(1.0, 0.1).self_compose(20)
    for eps in (0.5, 1.0):
        exact = pld.delta_by_direction(eps)
        for d in ("remove", "add"):
            lo, est, hi = run.histograms[d].delta_interval(eps, 0.999)
            assert lo <= exact[d] <= hi, (eps, d, lo, exact[d], hi)


def test_same_seed_same_counts_and_different_seed_differs():
    a, b, c = _run().run(), _run().run(), _run(seed=8).run()
    assert a.histograms == b.histograms
    assert a.histograms["remove"] != c.histograms["remove"]
    assert a.samples_done == 12_000 and a.complete


def test_chunk_seeds_are_the_spawned_children():
    entropy = 1234
    child = np.random.SeedSequence(entropy).spawn(2)[1].spawn(4)[3]  # direction add, chunk 3
    a = chunk_generator(entropy, (), "add", 3).random(5)
    b = np.random.default_rng(child).random(5)
    assert np.array_equal(a, b)
    # candidates of a calibration get a prefix key: independent of the plain run's streams
    c = chunk_generator(entropy, (0,), "add", 3).random(5)
    assert not np.array_equal(a, c)


def test_partial_then_resume_equals_uninterrupted(tmp_path):
    ck = tmp_path / "run.npz"
    full = _run().run()
    part = _run(checkpoint=ck).run(max_chunks=5)
    assert not part.complete and 0 < part.samples_done < full.samples_done
    calls = []
    resumed = resume(ck, sampler=dpsgd_loss_samples, callback=lambda d, t: calls.append((d, t)))
    assert resumed.complete
    assert resumed.histograms == full.histograms
    assert calls[-1] == (12_000, 12_000) and [c[0] for c in calls] == sorted(c[0] for c in calls)
    # resuming a finished run computes nothing and changes nothing
    again = resume(ck, sampler=dpsgd_loss_samples)
    assert again.histograms == full.histograms
    assert not list(tmp_path.glob("*.tmp"))  # no temporary files left behind


def test_checkpoint_records_config_and_refuses_mismatched_sampler(tmp_path):
    ck = tmp_path / "run.npz"
    run = _run(checkpoint=ck).run(max_chunks=3)
    loaded = MonteCarloRun.load(ck, sampler=dpsgd_loss_samples)
    assert loaded.config == run.config
    assert loaded.scheme == run.scheme and loaded.strategy == run.strategy
    assert loaded.histograms == run.histograms and loaded.done == run.done
    with pytest.raises(InvalidParameterError, match="sampler"):
        MonteCarloRun.load(ck)  # made with a custom sampler: must be given again
    with pytest.raises(InvalidParameterError, match="sampler"):
        MonteCarloRun.load(ck, sampler=gaussian_loss_samples)


def test_corrupt_and_foreign_checkpoints_are_refused(tmp_path):
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"not an npz")
    with pytest.raises(InvalidParameterError):
        MonteCarloRun.load(junk, sampler=dpsgd_loss_samples)
    other = tmp_path / "other.npz"
    np.savez(other, metadata=np.array('{"kind": "something else"}'))
    with pytest.raises(InvalidParameterError):
        MonteCarloRun.load(other, sampler=dpsgd_loss_samples)
    # counts that disagree with the recorded chunks
    ck = tmp_path / "run.npz"
    _run(checkpoint=ck).run(max_chunks=2)
    with np.load(ck) as data:
        arrays = {k: data[k] for k in data.files}
    arrays["remove_counts"] = arrays["remove_counts"] + 1
    np.savez(ck, **arrays)
    with pytest.raises(InvalidParameterError, match="corrupt"):
        MonteCarloRun.load(ck, sampler=dpsgd_loss_samples)


def test_sampler_shape_and_bad_config():
    def bad(strategy, scheme, sigma, m, rng, *, direction="remove"):
        return np.zeros(m + 1)

    with pytest.raises(InvalidParameterError, match="shape"):
        MonteCarloRun(None, None, 1.0, 10, seed=1, sampler=bad).run()
    with pytest.raises(InvalidParameterError):
        MonteCarloRun(None, None, 1.0, 10, seed=-1, sampler=gaussian_loss_samples)
    with pytest.raises(InvalidParameterError):
        MonteCarloRun(None, None, 1.0, 10, seed=1, directions=("sideways",), sampler=gaussian_loss_samples)
    with pytest.raises(InvalidParameterError):
        MonteCarloRun(None, None, 0.0, 10, seed=1, sampler=gaussian_loss_samples)


def test_seed_none_draws_and_records_entropy():
    a = MonteCarloRun(None, None, 1.0, 10, sampler=gaussian_loss_samples)
    b = MonteCarloRun(None, None, 1.0, 10, sampler=gaussian_loss_samples)
    assert a.entropy != b.entropy and a.entropy > 2**64
    assert a.to_dict()["seed_entropy"] == a.entropy


CHILD = """
import signal, sys, time
# SIGINT raises KeyboardInterrupt even when the parent ignores it (a child inherits an ignored signal,
# and Python then installs no handler of its own: the interrupt would be lost and the run finish)
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, {here!r})
from _dpsgd_sampler import dpsgd_loss_samples
from dpmf.accounting.montecarlo.run import MonteCarloRun
from dpmf.sampling import MinSepSampling, PoissonSampling
from dpmf.strategies import Identity

def park(done, total):
    # after three chunks (each checkpointed before this callback), announce and wait for the signal:
    # the run cannot finish before the parent interrupts it, however loaded the machine is
    if done >= 3000:
        open({ready!r}, "w").close()
        time.sleep(3600)

run = MonteCarloRun(Identity(10), PoissonSampling(0.1, 10), 1.0, 20_000, seed=99, chunk_size=1000,
                    checkpoint={ck!r}, sampler=dpsgd_loss_samples)
run.run(callback=park)
print("finished without interruption")
"""


def test_sigint_then_resume_gives_the_uninterrupted_counts(tmp_path):
    ck, ready = tmp_path / "sigint.npz", tmp_path / "ready"
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD.format(here=str(HERE), ck=str(ck), ready=str(ready))))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    # no wall-clock limit near the work: the child announces each step (the ready file, then its exit
    # on the signal), and the limits below are only there so that a lost signal cannot hang the suite
    deadline = time.time() + 900
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the child never reached its third chunk in 15 minutes"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the child ignored SIGINT for 15 minutes") from None
    assert proc.returncode != 0 and b"KeyboardInterrupt" in err, (out, err)
    partial = MonteCarloRun.load(ck, sampler=dpsgd_loss_samples)
    assert 0 < partial.samples_done < partial.samples_total  # really interrupted mid-run
    resumed = resume(ck, sampler=dpsgd_loss_samples)
    reference = MonteCarloRun(
        Identity(10), PoissonSampling(0.1, 10), 1.0, 20_000, seed=99, chunk_size=1000, sampler=dpsgd_loss_samples
    ).run()
    assert resumed.complete
    for d in ("remove", "add"):
        assert resumed.histograms[d] == reference.histograms[d]
        assert resumed.histograms[d].total == 20_000


def test_dask_two_workers_equals_local(tmp_path):
    distributed = pytest.importorskip("distributed")
    local = _run(num_samples=8000, chunk_size=500).run()
    ck = tmp_path / "dask.npz"
    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0"
    ) as cluster:
        seen = []
        remote = _run(num_samples=8000, chunk_size=500, checkpoint=ck)
        remote.run(max_chunks=3)  # some chunks locally first, the rest on the cluster
        remote.run(scheduler=cluster.scheduler_address, callback=lambda d, t: seen.append(d))
    assert remote.complete and remote.histograms == local.histograms
    assert seen[-1] == 16_000
    assert MonteCarloRun.load(ck, sampler=dpsgd_loss_samples).histograms == local.histograms


def test_local_worker_processes_equal_serial(tmp_path):
    """workers=2: chunks in two processes, merged as they finish; counts equal the serial run."""
    local = _run(num_samples=8000, chunk_size=500).run()
    ck = tmp_path / "procs.npz"
    seen = []
    par = _run(num_samples=8000, chunk_size=500, checkpoint=ck)
    par.run(max_chunks=3)
    par.run(workers=2, callback=lambda d, t: seen.append(d))
    assert par.complete and par.histograms == local.histograms
    assert seen[-1] == 16_000 and seen == sorted(seen)
    assert MonteCarloRun.load(ck, sampler=dpsgd_loss_samples).histograms == local.histograms
    with pytest.raises(InvalidParameterError, match="workers"):
        _run().run(workers=0)


def test_default_sampler_in_worker_processes_equals_serial():
    """The compiled default sampler gives the same counts in worker processes (seeded per chunk)."""
    from dpmf.strategies import ToeplitzStrategy

    strat = ToeplitzStrategy(np.array([1.0, 0.5, 0.25]), 32)
    scheme = MinSepSampling(0.1, 32, 3, warm_start=True)
    a = MonteCarloRun(strat, scheme, 1.0, 4000, seed=3, chunk_size=500).run()
    b = MonteCarloRun(strat, scheme, 1.0, 4000, seed=3, chunk_size=500).run(workers=2)
    assert a.histograms == b.histograms


def test_chunk_set_collapses_out_of_order_chunks():
    from dpmf.accounting.montecarlo.run import ChunkSet

    s = ChunkSet()
    for i in (2, 0, 5, 1, 3):
        s = s.add(i)
    assert (s.prefix, sorted(s.extras)) == (4, [5])
    assert list(s) == [0, 1, 2, 3, 5] and len(s) == 5 and 4 not in s and 5 in s
    assert ChunkSet.from_json(s.to_json()) == s
