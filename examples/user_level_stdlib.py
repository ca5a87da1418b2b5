"""User-level training on a public multi-attribution graph: the standard library's own sources.

Examples are ``--context``-byte chunks of the Python standard library's ``.py`` files (offline, real
text). Each chunk is attributed to *users*: the code units (top-level or nested ``def`` / ``class``,
named by file and name; the module body before the first one) it belongs to -- the unit its first
byte is in, and every unit that starts inside it. A chunk across a boundary belongs to two or more
units: the multi-attribution setting of Dong & Ganesh 2026 (Sec. 6; Ganesh et al. 2025), where
neighbouring datasets differ in *all* chunks of one user, and the graph itself is public
(fixed-graph adjacency). (With whole packages as users, ``--users packages``, each package keeps
only ``k_u`` chunks: user-level privacy needs many users, and 60 files have ~100 packages but
~2,000 code units.)

The run, each step one dpmf call:

1. ``bound_contributions``: at most ``--k-u`` chunks per user (and optionally ``|N(e)| <= --k-e``,
   App. C), a greedy on the graph only (free); its report says what was dropped and why.
2. ``calibrate_sampling_prob``: the sampling probability whose expected batch after ``--warmup``
   generated-and-discarded steps is ``--batch`` (Sec. 7.3's search, simulated on the graph);
   App. C's rule of thumb ``b p k_e < 1`` is printed for the graph's largest neighbourhood.
3. ``make_private(..., sampling=bounded.scheme(p, steps, b, warmup), attribution=bounded.attribution)``:
   Alg. 3's user-respecting batches, BandMF noise (``bsr(steps, b)``, ``b`` bands = ``min_sep``),
   per-example clipping; a byte-bigram model (embedding 32, 16k parameters) trains ``--steps``
   steps with SGD; held-out-free: the printed loss is the mean next-byte loss (bits) of the kept
   chunks before and after.
4. The user-level epsilon: by default the *certified* unamplified bound (each user joins at most
   ``ceil(steps / b)`` steps with at most ``k_u`` chunks: sensitivity ``k_u`` times BandMF's) and a
   Monte Carlo *estimate* of the amplified epsilon (Thm. 6.1's pair, ``certified=False``, printed as
   an estimate); ``--certify EPS`` instead calibrates the noise with Monte Carlo
   Estimate-Verify-Release (Algorithm 5, certified; minutes).

``python examples/user_level_stdlib.py`` (default, ~1 minute with imports on a loaded 2-core
machine) | ``--certify 8`` (certified amplified epsilon, a few minutes) | ``--json out.json``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import re
import sysconfig
import time
from pathlib import Path

import numpy as np
import torch

import dpmf
from dpmf.sampling import bound_contributions, calibrate_sampling_prob, edge_bound_rule_of_thumb, neighbourhood_sizes
from dpmf.strategies import bsr
from dpmf.training.torch import make_private

UNIT = re.compile(rb"^[ \t]*(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_][A-Za-z0-9_]*)", re.MULTILINE)
SKIP = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


def stdlib_chunks(max_files: int, context: int, by: str = "units") -> tuple[list[bytes], list[set[str]]]:
    """Chunks of the first ``max_files`` stdlib ``.py`` files (sorted paths) and each chunk's users:
    its code units (``by="units"``, module docstring) or its file's top-level package."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not SKIP & set(p.relative_to(root).parts))[:max_files]
    chunks, users = [], []
    for path in files:
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        starts = [(m.start(), f"{rel}:{m.group(1).decode()}@{m.start()}") for m in UNIT.finditer(data)]
        offsets = [o for o, _ in starts]
        for i in range(0, len(data), context):
            chunks.append(data[i: i + context])
            if by == "packages":
                users.append({path.relative_to(root).parts[0].removesuffix(".py")})
                continue
            j = bisect.bisect_right(offsets, i)  # units starting at or before byte i
            here = {starts[j - 1][1] if j else f"{rel}:<module>"}
            k = j
            while k < len(starts) and starts[k][0] < i + context:
                here.add(starts[k][1])
                k += 1
            users.append(here)
    return chunks, users


class ByteBigram(torch.nn.Module):
    """Next-byte logits from the current byte: an embedding and a linear read-out."""

    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, dim)
        self.out = torch.nn.Linear(dim, 256)

    def forward(self, x):
        return self.out(torch.tanh(self.embed(x)))


def loss_fn(logits, targets):
    """Mean next-byte cross entropy of each sequence (nats), padding (-100) ignored."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, 256), targets.reshape(-1), ignore_index=-100)


def tensors(chunks: list[bytes], context: int):
    x = torch.zeros(len(chunks), context - 1, dtype=torch.long)
    y = torch.full((len(chunks), context - 1), -100, dtype=torch.long)
    for i, c in enumerate(chunks):
        b = torch.tensor(list(c), dtype=torch.long)
        x[i, : b.numel() - 1] = b[:-1]
        y[i, : b.numel() - 1] = b[1:]
    return x, y


@torch.no_grad()
def bits(model, x, y) -> float:
    logits = model(x)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1), ignore_index=-100)
    return float(nll) / math.log(2)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-files", type=int, default=60, help="stdlib .py files (sorted paths) to chunk")
    ap.add_argument("--context", type=int, default=64, help="bytes per chunk (example)")
    ap.add_argument("--users", choices=("units", "packages"), default="units", help="who the users are")
    ap.add_argument("--k-u", type=int, default=4, help="max chunks per user (contribution bound)")
    ap.add_argument("--k-e", type=int, default=None, help="max |N(e)| of a kept chunk (App. C edge bound)")
    ap.add_argument("--min-sep", type=int, default=4, help="b: a user joins at most once in b steps; BandMF bands")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=32, help="batches generated and discarded before training")
    ap.add_argument("--batch", type=float, default=16.0, help="target expected batch size after the warm-up")
    ap.add_argument("--sigma", type=float, default=1.0, help="noise multiplier (unless --certify)")
    ap.add_argument("--certify", type=float, default=None, metavar="EPS",
                    help="calibrate the noise to this user-level epsilon with certified Monte Carlo (minutes)")
    ap.add_argument("--delta", type=float, default=1e-3)
    ap.add_argument("--mc-samples", type=int, default=20_000, help="samples of the Monte Carlo estimate")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    args = ap.parse_args(argv)
    start = time.perf_counter()
    torch.manual_seed(args.seed)

    chunks, users = stdlib_chunks(args.max_files, args.context, args.users)
    print(f"graph: {len(chunks)} chunks of {args.context} bytes from {args.max_files} stdlib files, "
          f"{len(set().union(*users))} users ({'code units' if args.users == 'units' else 'packages'}), "
          f"{sum(len(u) > 1 for u in users)} chunks with several users")
    bounded = bound_contributions(users, args.k_u, max_neighbourhood=args.k_e, seed=args.seed)
    rep = bounded.report
    print("bounding:", rep.summary())

    cal = calibrate_sampling_prob(args.batch, args.min_sep, attribution=bounded.attribution,
                                  warmup_steps=args.warmup, measure_steps=2000, seed=args.seed)
    print(f"sampling probability {cal.sampling_prob:.5f}: expected batch after {args.warmup} warm-up steps "
          f"{cal.batch_size:.2f} +- {cal.std_error:.2f} (target {args.batch:g}; simulated on the public graph)")
    k_e = int(neighbourhood_sizes(bounded.attribution).max())
    rot = edge_bound_rule_of_thumb(args.min_sep, cal.sampling_prob, k_e)
    print(f"App. C rule of thumb for the largest neighbourhood |N(e)| = {k_e}: b p k_e = {rot.value:.3f} "
          f"({'< 1: fine' if rot.holds else '>= 1: consider --k-e ' + str(rot.largest_edge_bound)})")

    scheme = bounded.scheme(cal.sampling_prob, args.steps, args.min_sep, warmup_steps=args.warmup)
    strategy = bsr(args.steps, args.min_sep)
    kept = [chunks[i] for i in bounded.kept]
    x, y = tensors(kept, args.context)
    data = torch.utils.data.TensorDataset(x, y)
    model = ByteBigram()
    before = bits(model, x, y)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    guarantee = (dict(target_epsilon=args.certify, accountant="montecarlo", accountant_options={"seed": args.seed})
                 if args.certify is not None else dict(noise_multiplier=args.sigma, accountant="unamplified"))
    run = make_private(model, opt, data, strategy=strategy, sampling=scheme, delta=args.delta, max_grad_norm=1.0,
                       loss_fn=loss_fn, seed=args.seed, attribution=bounded.attribution, normalizer=args.batch,
                       **guarantee)
    sizes = []
    for xb, yb in run.data_loader:
        sizes.append(len(xb))
        run.optimizer.zero_grad()
        run.optimizer.step(xb, yb)
    after = bits(model, x, y)
    report = run.privacy.report()
    print(f"trained {run.privacy.steps_done} steps, batch sizes {sizes}; next-byte loss {before:.3f} -> "
          f"{after:.3f} bits/byte on the kept chunks")
    print("user-level guarantee:", report.summary())
    estimate = None
    if args.certify is None:
        estimate = dpmf.account(strategy, scheme, run.privacy.noise_multiplier, args.delta, method="montecarlo",
                                num_samples=args.mc_samples, seed=args.seed)
        print(f"amplified user-level epsilon, Monte Carlo ESTIMATE (certified={estimate.certified}, not a proof; "
              f"{args.mc_samples} samples, Thm. 6.1 pair): {estimate.epsilon:.3f} at delta {args.delta:g}; "
              f"pass --certify EPS for a certified amplified epsilon")
    out = {
        "config": vars(args) | {"json": str(args.json) if args.json else None},
        "graph": {"chunks": len(chunks), "users": len(set().union(*users))},
        "bounding": rep.describe(),
        "sampling": cal.describe(),
        "rule_of_thumb": {"max_neighbourhood": k_e, "b_p_ke": rot.value, "holds": rot.holds},
        "training": {"steps": run.privacy.steps_done, "batch_sizes": sizes, "bits_before": before,
                     "bits_after": after},
        "report": report.to_dict(),
        "montecarlo_estimate": None if estimate is None else {"epsilon": estimate.epsilon,
                                                               "certified": estimate.certified},
        "seconds": time.perf_counter() - start,
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")
    return out


if __name__ == "__main__":
    main()
