"""Reference values of the mixture PLDs and MMCC, computed on main at 2cb94a5 (before the compiled
row kernel). Written to tests/data/mmcc_reference.json."""
import json, time
import numpy as np
import dpmf
from dpmf.privacy.mixture import mixture_of_gaussians
from dpmf.accounting.mmcc.rows import row_pld
from dpmf.strategies import bsr, BinaryTree, Identity, ToeplitzStrategy
from dpmf.sampling import PoissonSampling, CyclicPoissonSampling

out = {"commit": "2cb94a5", "mixtures": [], "rows": [], "mmcc": []}
rng = np.random.default_rng(0)
mix_cases = [
    ([0.0, 1.0], [0.99, 0.01], 1.0, 1e-4),
    ([0.0, 0.5, 1.0, 1.5], [0.7, 0.2, 0.08, 0.02], 0.8, 1e-4),
    ([0.3, 0.9, 2.0], [0.5, 0.3, 0.2], 2.0, 1e-3),
    (list(np.arange(0, 41) * 0.05), list(rng.dirichlet(np.ones(41))), 1.5, 1e-4),
    ([0.0, 3.0], [0.5, 0.5], 0.5, 1e-3),
]
for c, p, s, d in mix_cases:
    pld = mixture_of_gaussians(c, p, s, discretization=d)
    comp = pld.self_compose(20)
    out["mixtures"].append({"c": list(map(float, c)), "p": list(map(float, p)), "sigma": s, "disc": d,
        "eps": {str(dl): pld.epsilon_by_direction(dl) for dl in (1e-3, 1e-6, 1e-10)},
        "eps20": {str(dl): comp.epsilon_by_direction(dl) for dl in (1e-3, 1e-6)}})
# MMCC-like rows
row_cases = [
    (np.array([1.0, 0.5, 0.375, 0.3125]), np.array([0.6, 0.5, 0.3, 0.1]), 1.0, 0.01, 1e-4),
    (np.array([1.0, 0.5, 0.375, 0.3125, 0.27, 0.24, 0.22, 0.2]), np.array([0.9] * 8), 2.0, 0.01, 1e-4),
    (np.linspace(1, 0.2, 16), np.full(16, 0.3), 3.0, 0.01, 1e-4),
]
for c, p, s, g, d in row_cases:
    pld = row_pld(c, p, s, g, d)
    out["rows"].append({"c": c.tolist(), "p": p.tolist(), "sigma": s, "grid_step": g, "disc": d,
        "eps": {str(dl): pld.epsilon_by_direction(dl) for dl in (1e-3, 1e-6, 1e-10)}})
mmcc_cases = [
    ("bsr", 64, 4, "poisson", 0.05, 2.0, 1e-3),
    ("bsr", 128, 8, "poisson", 0.02, 3.0, 1e-6),
    ("tree", 16, None, "poisson", 1 / 16, 2.0, 1e-5),
    ("tree", 64, None, "poisson", 1 / 16, 2.0, 1e-5),
    ("sqrt", 48, None, "poisson", 0.05, 4.0, 1e-6),
    ("bsr", 64, 4, "cyclic", 0.2, 3.0, 1e-6),
]
for kind, n, b, samp, q, s, dl in mmcc_cases:
    strat = bsr(n, b) if kind == "bsr" else BinaryTree(n) if kind == "tree" else ToeplitzStrategy.sqrt_prefix_sum(n)
    sch = PoissonSampling(q, n) if samp == "poisson" else CyclicPoissonSampling(q, n, cycle_length=4)
    t = time.process_time()
    r = dpmf.account(strat, sch, s, dl, method="mmcc")
    print(kind, n, b, samp, q, s, dl, r.epsilon, r.diagnostics.get("independent_rows_heuristic_epsilon"), time.process_time() - t, flush=True)
    out["mmcc"].append({"kind": kind, "n": n, "bands": b, "sampling": samp, "q": q, "sigma": s, "delta": dl,
        "epsilon": r.epsilon, "heuristic": r.diagnostics.get("independent_rows_heuristic_epsilon")})
json.dump(out, open("tests/data/mmcc_reference.json", "w"), indent=1)
