"""Audit a training run empirically: canaries through the real sampler, clipping, noise and optimizer.

:func:`audit_training` trains once (or ``runs`` times) with ``m`` canaries whose coins decide, each
with probability 1/2, whether the canary is *included*; the attacker scores the canaries without
the coins, and :mod:`dpmf.auditing.bounds` turns its guesses into an **empirical lower bound** on
epsilon (never a certificate), printed next to the run's certified upper bound
(:class:`~dpmf.auditing.report.AuditReport`).

How the canaries enter the run (the real training path, nothing simulated):

* The dataset is the real examples plus ``m`` canary examples, always present: an excluded canary
  is *zeroed out* (its per-example clip weight is 0, :meth:`DPOptimizer.step`'s ``weights``), which
  is exactly the zero-out adjacency every dpmf epsilon is for. The dataset size, hence the plan
  (sigma, normalizer, report), does not depend on the coins.
* The run is built by :func:`~dpmf.training.torch.engine.make_private` (functorch per-example
  gradients) and stepped on the data loader's batches, so canaries are sampled by the configured
  scheme, clipped with the real clipper and noised by the real correlated-noise generator.

Threat models (:data:`~dpmf.auditing.report.THREAT_MODELS`):

* ``"white-box"``: the model gets an *audit block* of ``m`` extra parameters that real examples never
  touch; canary ``i``'s loss is ``gain * clip * theta_audit[i]``, a Dirac gradient of norm
  ``gain * clip`` (``gain`` = :data:`DIRAC_GAIN`, far above the clip norm) in coordinate ``i`` and
  nowhere else, so the clipped canary contributes exactly the clip norm to its own coordinate. The
  attacker reads the released noisy gradient of the audit block after every step (the block's
  learning rate is 0: it stays at 0), rescales to clip-norm units, whitens with ``C``
  (:mod:`dpmf.auditing.whitebox`) and scores each canary by its likelihood ratio over the
  sampler's law. Its tests are pre-registered by simulating the *claimed* mechanism
  (:func:`dpmf.auditing.game.preregister`: the claim-optimal guess count, plus gross-fault tests on
  scores fitted to the released noise, under a weighted Bonferroni correction).
* ``"black-box"``: only the final model. Canaries are input-space examples -- on the built-in task
  each on its own input feature (:func:`builtin_task`), for your model ``canary_data`` or far-away
  inputs with random labels -- and the score is how much training lowered a canary's loss
  (initial model minus final model); the guess counts are a short Bonferroni grid.

``runs > 1`` is the many-run mode for tiny models: ``runs`` independent trainings with one canary
each and the Clopper-Pearson bound (a pre-registered threshold in white-box mode, a split in
black-box mode).

Example (DP-SGD, Poisson sampling, the built-in model; a few seconds)::

    >>> from dpmf.strategies import Identity
    >>> from dpmf.sampling import PoissonSampling
    >>> rep = audit_training(strategy=Identity(32), sampling=PoissonSampling(0.2, 32), noise_multiplier=2.0,
    ...                      delta=1e-5, canaries=200, seed=0, reference_trials=5)  # doctest: +SKIP
    >>> rep.epsilon_lower <= rep.epsilon_certified  # doctest: +SKIP
    True
"""

from __future__ import annotations

import math
import time
from typing import Callable

import numpy as np

from dpmf import progress
from dpmf import validation as _v
from dpmf.auditing.report import THREAT_MODELS, AuditReport
from dpmf.errors import InvalidParameterError, UnsupportedConfigurationError
from dpmf.auditing import bounds as _stats
from dpmf.training.plan import ExecutionPlan, build_plan
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.engine import make_private

torch = require_torch()

__all__ = ["audit_training", "builtin_task", "AuditedModule", "DIRAC_GAIN", "DEFAULT_REAL_EXAMPLES"]

#: Norm of a white-box canary's gradient, in clip norms: far above 1, so clipping decides what the
#: canary contributes (exactly the clip norm), and a run that does not clip shows it.
DIRAC_GAIN = 100.0

#: Real examples of the built-in task when ``num_examples`` is not given.
DEFAULT_REAL_EXAMPLES = 1000


# ---------------------------------------------------------------------------- the built-in task


def builtin_task(num_examples: int = DEFAULT_REAL_EXAMPLES, *, seed: int = 0, features: int = 8,
                 canary_features: int = 0):
    """``(dataset, make_model, canary_data)``: a small synthetic binary classification task (Gaussian
    inputs, labels from a random linear teacher with 10% flipped), a factory of its model (an MLP
    ``inputs -> 16 -> 2`` with tanh; ``make_model(seed)``) and, with ``canary_features = m > 0``,
    ``m`` black-box canaries.

    Black-box canaries live on their own input features: every input gets ``m`` extra features,
    always 0 for real examples; canary ``i`` is ``3 e_i`` on them (0 on the real features) with a
    random label. Only canary ``i`` ever trains the first-layer weights of its feature, so its
    influence on the final model is not drowned by what the real data do (the input-space analogue
    of the white-box Dirac canary); ``canary_data`` is ``None`` without them."""
    n = _v.positive_int("num_examples", num_examples)
    extra = int(canary_features)
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(n, features, generator=g)
    w = torch.randn(features, generator=g)
    y = (x @ w > 0).long()
    flip = torch.rand(n, generator=g) < 0.1
    y = torch.where(flip, 1 - y, y)
    canary_data = None
    if extra:
        x = torch.cat([x, torch.zeros(n, extra)], dim=1)
        cx = torch.zeros(extra, features + extra)
        cx[torch.arange(extra), features + torch.arange(extra)] = 3.0
        canary_data = (cx, torch.randint(0, 2, (extra,), generator=g))

    def make_model(model_seed: int = 0):
        torch.manual_seed(int(model_seed))
        return torch.nn.Sequential(torch.nn.Linear(features + extra, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    return torch.utils.data.TensorDataset(x, y), make_model, canary_data


# ---------------------------------------------------------------------------- canaries in the model


class AuditedModule(torch.nn.Module):
    """``model`` with the canary tag as a second input and, in white-box audits, the audit block.

    ``forward(x, tag)`` returns ``(model(x), dirac, tag)``: ``tag`` is ``-1`` for a real example and
    ``i`` for canary ``i``; ``dirac = gain * theta_audit[tag]`` (0 for real examples), whose gradient is
    ``gain * e_tag`` in the audit block and 0 everywhere else. Without an audit block (black-box)
    ``dirac`` is 0 and the canaries are ordinary examples."""

    def __init__(self, model, canaries: int, *, white_box: bool, gain: float) -> None:
        super().__init__()
        self.model = model
        self.canaries = int(canaries)
        self.gain = float(gain)
        dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
        self.audit_block = torch.nn.Parameter(torch.zeros(self.canaries, dtype=dtype)) if white_box else None

    def forward(self, x, tag):
        out = self.model(x)
        if self.audit_block is None:
            return out, torch.zeros(tag.shape, dtype=torch.float32, device=tag.device), tag
        onehot = (torch.arange(self.canaries, device=tag.device) == tag.unsqueeze(-1)).to(self.audit_block.dtype)
        return out, self.gain * (onehot @ self.audit_block), tag


class _AuditLoss:
    """The per-example loss of an audited run: the user's loss for real examples (and black-box
    canaries), the Dirac term for white-box canaries (the user's loss is masked out for them, so
    their gradient in the model is exactly 0)."""

    def __init__(self, loss_fn: Callable, white_box: bool) -> None:
        self.loss_fn, self.white_box = loss_fn, white_box

    def __call__(self, out, target):
        pred, dirac, tag = out
        real = self.loss_fn(pred, target)
        if not self.white_box:
            return real
        return torch.where((tag >= 0).all(), dirac.sum().to(real.dtype), real)


class _AuditData(torch.utils.data.Dataset):
    """The real examples (tag -1) followed by the canaries (tag ``i``); items ``((x, tag), y)``."""

    def __init__(self, base, canary_x, canary_y) -> None:
        self.base, self.cx, self.cy = base, canary_x, canary_y
        self.real = len(base)

    def __len__(self) -> int:
        return self.real + len(self.cx)

    def __getitem__(self, i):
        if i < self.real:
            x, y = _pair(self.base[i])
            return (x, torch.tensor(-1)), y
        j = i - self.real
        return (self.cx[j], torch.tensor(j)), self.cy[j]


def _pair(item):
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise InvalidParameterError("an audited dataset must yield (input, target) pairs (one input tensor each)")
    return item[0], item[1]


# ---------------------------------------------------------------------------- one training run


def _canary_examples(dataset, m: int, white_box: bool, rng: np.random.Generator, canary_data):
    """Canary inputs and targets: white-box: copies of the first real example (their loss is masked,
    only the Dirac term counts); black-box: ``canary_data`` or far-away inputs with random labels."""
    x0, y0 = _pair(dataset[0])
    if white_box:
        return x0.unsqueeze(0).repeat(m, *([1] * x0.ndim)), torch.as_tensor(y0).unsqueeze(0).repeat(m)
    if canary_data is not None:
        cx, cy = canary_data
        cx, cy = torch.as_tensor(cx), torch.as_tensor(cy)
        if cx.shape[0] != m or cy.shape[0] != m:
            raise InvalidParameterError(f"canary_data must hold {m} inputs and {m} targets, got {cx.shape[0]} and "
                                        f"{cy.shape[0]}")
        return cx, cy
    y0 = torch.as_tensor(y0)
    if y0.dtype not in (torch.int64, torch.int32) or y0.ndim != 0:
        raise InvalidParameterError(
            "black-box canaries are far-away inputs with random class labels: the dataset's targets must be integer "
            "class labels, or pass canary_data=(inputs, targets) with one canary per row"
        )
    classes = int(max(int(_pair(dataset[i])[1]) for i in range(min(len(dataset), 1000)))) + 1
    d = x0.numel()
    x = rng.standard_normal((m, d))
    x = 3.0 * math.sqrt(d) * x / np.linalg.norm(x, axis=1, keepdims=True)  # 3x a typical N(0, I) norm
    cx = torch.as_tensor(x, dtype=x0.dtype).reshape(m, *x0.shape)
    cy = torch.as_tensor(rng.integers(0, max(classes, 2), size=m), dtype=y0.dtype)
    return cx, cy


def _losses(model, x, y, loss_fn) -> np.ndarray:
    """Per-example losses (float64) of ``model`` on the canaries, one at a time (as training saw them)."""
    out = []
    with torch.no_grad():
        for i in range(0, x.shape[0], 256):
            xb, yb = x[i:i + 256], y[i:i + 256]
            pred = model(xb)
            out.extend(float(loss_fn(pred[j:j + 1], yb[j:j + 1])) for j in range(xb.shape[0]))
    return np.asarray(out, dtype=np.float64)


class _Run:
    """What one audited training run released to the attacker."""

    def __init__(self, plan, released, scores_bb, coins):
        self.plan, self.released, self.scores_bb, self.coins = plan, released, scores_bb, coins


def _train_once(*, plan_args: dict, plan: ExecutionPlan | None, dataset, model, optimizer, loss_fn, m: int,
                white_box: bool, coins: np.ndarray, seed: int, canary_data, step_done: Callable[[], None]) -> _Run:
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3]))
    cx, cy = _canary_examples(dataset, m, white_box, rng, canary_data)
    clip = plan.max_grad_norm if plan is not None else plan_args["max_grad_norm"]
    audited = AuditedModule(model, m, white_box=white_box, gain=DIRAC_GAIN * clip)
    if white_box:
        optimizer.add_param_group({"params": [audited.audit_block], "lr": 0.0, "weight_decay": 0.0})
    data = _AuditData(dataset, cx, cy)
    initial = None
    if not white_box:
        initial = _losses(model, cx, cy, loss_fn)
    kwargs = dict(loss_fn=_AuditLoss(loss_fn, white_box), grad_sample_mode="functorch", seed=int(seed))
    if plan is not None:
        run = make_private(audited, optimizer, data, plan=plan, **kwargs)
    else:
        run = make_private(audited, optimizer, data, **plan_args, **kwargs)
    opt, loader, privacy = run.optimizer, run.data_loader, run.privacy
    p = privacy.plan
    coin_t = torch.as_tensor(coins, dtype=torch.float64)
    released = np.zeros((p.steps, m)) if white_box else None
    unit = p.normalizer / p.max_grad_norm
    for t, ((x, tag), y) in enumerate(loader):
        opt.zero_grad()
        w = torch.where(tag < 0, torch.ones(tag.shape, dtype=torch.float64), coin_t[tag.clamp(min=0)])
        opt.step([x, tag], y, weights=w)
        if white_box:
            released[t] = audited.audit_block.grad.detach().to(torch.float64).cpu().numpy() * unit
        step_done()
    scores_bb = None
    if not white_box:
        scores_bb = initial - _losses(model, cx, cy, loss_fn)
    return _Run(p, released, scores_bb, coins)


# ---------------------------------------------------------------------------- the audit


def _check_threat(threat: str) -> str:
    if threat not in THREAT_MODELS:
        raise InvalidParameterError(f"threat must be one of {tuple(THREAT_MODELS)}, got {threat!r}")
    return threat


def _model_factory(model, optimizer, learning_rate: float, builtin_make):
    """``make(run) -> (module, optimizer)``: the built-in MLP with SGD, a user's factory, or the
    user's single module and optimizer (one run only)."""
    if model is None:
        def make(run: int):
            net = builtin_make(10_000 + run)
            return net, torch.optim.SGD(net.parameters(), lr=learning_rate)
        return make, False
    if isinstance(model, torch.nn.Module):
        if optimizer is None:
            raise InvalidParameterError("pass optimizer= (over model.parameters()) with your model")
        used = []

        def make(run: int):
            if used:
                raise InvalidParameterError(
                    "runs > 1 trains a fresh model per run: pass model=<a function run -> (module, optimizer)>"
                )
            used.append(run)
            return model, optimizer
        return make, True
    if callable(model):
        if optimizer is not None:
            raise InvalidParameterError("with model=<factory> the factory returns the optimizer; drop optimizer=")

        def make(run: int):
            out = model(run)
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
                raise InvalidParameterError("model(run) must return (module, optimizer)")
            return out
        return make, True
    raise InvalidParameterError(f"model must be a torch.nn.Module or a factory, got {type(model).__name__}")


def audit_training(
    *,
    strategy=None,
    sampling=None,
    delta: float | None = None,
    noise_multiplier: float | None = None,
    target_epsilon: float | None = None,
    max_grad_norm: float = 1.0,
    plan: ExecutionPlan | None = None,
    accountant: str = "auto",
    accountant_options: dict | None = None,
    canaries: int = 1000,
    threat: str = "white-box",
    seed: int = 0,
    confidence: float = 0.95,
    runs: int = 1,
    model=None,
    optimizer=None,
    dataset=None,
    loss_fn: Callable | None = None,
    canary_data=None,
    num_examples: int | None = None,
    learning_rate: float = 2.0,
    reference_trials: int = 25,
    callback: Callable[[int, int], None] | None = None,
) -> AuditReport:
    """Audit a private training configuration empirically (module docstring).

    Args:
        strategy, sampling, delta, noise_multiplier | target_epsilon, max_grad_norm, accountant,
            accountant_options: the configuration, exactly as for
            :func:`~dpmf.training.torch.engine.make_private`; or ``plan``: an
            :class:`~dpmf.training.plan.ExecutionPlan` built for ``len(dataset) + canaries`` examples
            (reused as it is: no second accounting).
        canaries: ``m``, the number of canaries (one run); in many-run mode the number of runs.
        threat: ``"white-box"`` (every noisy update) or ``"black-box"`` (the final model only).
        seed: the audit's seed: coins, canaries, sampler, noise and simulations use independent
            streams of it (the scorer never sees the coins).
        confidence: of the lower bound (default 0.95).
        runs: 1 for a one-run audit; ``> 1``: that many independent runs with one canary each
            (tiny models; Clopper-Pearson).
        model, optimizer, dataset, loss_fn: your model, its optimizer, your dataset of ``(input,
            target)`` pairs and ``loss_fn(output, target)`` (a scalar, as in ``make_private``). All
            ``None``: the built-in task (:func:`builtin_task` with ``num_examples`` real examples,
            SGD at ``learning_rate``). For ``runs > 1`` pass ``model`` as a function
            ``run -> (module, optimizer)``.
        canary_data: black-box only: ``(inputs, targets)`` of your own canaries (default: far-away
            inputs with random labels; needs integer class labels).
        reference_trials: simulations of the ideal attacker (0: no references).
        callback: ``callback(steps_done, steps_total)`` after every training step.

    Returns:
        an :class:`~dpmf.auditing.report.AuditReport`: ``epsilon_lower`` (**empirical lower bound**,
        not a certificate), ``epsilon_certified`` (the plan's report), the gap, the references,
        the statistics and a plot of the attack against the report's trade-off curve.
    """
    from dpmf.auditing.game import ideal_gaussian_reference, mechanism_audit, preregister, simulate_released
    from dpmf.auditing.whitebox import WhiteBoxScorer

    start = time.perf_counter()
    threat = _check_threat(threat)
    white_box = threat == "white-box"
    m_total = _v.positive_int("canaries", canaries)
    R = _v.positive_int("runs", runs)
    conf = _v.open_unit("confidence", confidence)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InvalidParameterError(f"seed must be an integer >= 0, got {seed!r}")
    seed = int(seed)
    _v.positive("learning_rate", learning_rate)
    trials = 0 if reference_trials == 0 else _v.positive_int("reference_trials", reference_trials)
    if R == 1 and m_total < 2:
        raise InvalidParameterError(f"a one-run audit needs at least 2 canaries, got {m_total}")
    if R > 1 and m_total != R:
        raise InvalidParameterError(
            f"many-run mode trains one canary per run: canaries must equal runs ({R}), got {m_total}"
        )
    m = 1 if R > 1 else m_total
    if not white_box and canary_data is not None and R > 1:
        raise InvalidParameterError("canary_data is for one-run audits (m canaries in one run)")

    builtin_make = None
    if model is None:
        if dataset is not None or loss_fn is not None or optimizer is not None:
            raise InvalidParameterError("dataset, loss_fn and optimizer go with model=; leave all four out for "
                                        "the built-in task")
        if canary_data is not None:
            raise InvalidParameterError("canary_data goes with your own model; the built-in task makes its own")
        dataset, builtin_make, canary_data = builtin_task(
            num_examples or DEFAULT_REAL_EXAMPLES, seed=seed, canary_features=0 if white_box else m)
        loss_fn = torch.nn.functional.cross_entropy
        model_name = "built-in"
    else:
        if dataset is None or loss_fn is None:
            raise InvalidParameterError("auditing your own model needs dataset= and loss_fn= too")
        if num_examples is not None:
            raise InvalidParameterError("num_examples is for the built-in task; your dataset's size is len(dataset)")
        model_name = "user"
    make, _ = _model_factory(model, optimizer, learning_rate, builtin_make)
    N = len(dataset) + m

    plan_args = dict(strategy=strategy, sampling=sampling, delta=delta, max_grad_norm=max_grad_norm,
                     noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, accountant=accountant,
                     accountant_options=accountant_options)
    if plan is not None:
        given = [k for k in ("strategy", "sampling", "noise_multiplier", "target_epsilon") if plan_args[k] is not None]
        if given:
            raise InvalidParameterError(f"plan= fixes the configuration: do not also pass {', '.join(given)}")
        if not isinstance(plan, ExecutionPlan):
            raise InvalidParameterError(f"plan must be an ExecutionPlan (build_plan), got {type(plan).__name__}")
        if plan.num_examples != N:
            raise InvalidParameterError(
                f"the plan is for {plan.num_examples} examples but the audited dataset has {N} "
                f"({N - m} real + {m} canaries): build it with num_examples={N}"
            )
    elif R > 1:  # certify once, train many times
        if strategy is None or sampling is None or delta is None:
            raise InvalidParameterError("pass strategy, sampling and delta (with noise_multiplier or target_epsilon), "
                                        "or plan=")
        plan = build_plan(strategy, sampling, num_examples=N, delta=delta, max_grad_norm=max_grad_norm,
                          noise_multiplier=noise_multiplier, target_epsilon=target_epsilon, accountant=accountant,
                          **(accountant_options or {}))
    if plan is not None:
        steps = plan.steps
    else:
        if sampling is None:
            raise InvalidParameterError("pass sampling= (with strategy, delta and noise_multiplier or target_epsilon)")
        steps = sampling.steps

    coin_rng = np.random.default_rng(np.random.SeedSequence([seed, 1]))
    total = steps * R
    runs_out = []
    with progress.task(f"audit ({threat}): training with canaries", total=total, unit="steps") as bar:
        done = [0]

        def step_done() -> None:
            done[0] += 1
            bar.advance()
            if callback is not None:
                callback(done[0], total)

        for r in range(R):
            coins = coin_rng.random(m) < 0.5
            module, opt = make(r)
            run = _train_once(plan_args=plan_args, plan=plan, dataset=dataset, model=module, optimizer=opt,
                              loss_fn=loss_fn, m=m, white_box=white_box, coins=coins,
                              seed=int(np.random.SeedSequence([seed, 2, r]).generate_state(1)[0]),
                              canary_data=canary_data, step_done=step_done)
            runs_out.append(run)
            plan = run.plan  # the plan of the first run serves the others (certified once)
    coins = np.concatenate([r.coins for r in runs_out])
    p = plan
    certified = p.report
    d = p.delta
    sim_seed = np.random.SeedSequence([seed, 4])

    score_info: dict = {}
    scorer = None
    variants = None
    if white_box:
        scorer = WhiteBoxScorer(p.strategy, p.scheme, p.noise_multiplier, N)
        released = np.concatenate([r.released for r in runs_out], axis=1)
        variants = scorer.scores(released)
        scores = variants["claimed"]
        score_info = {
            **scorer.describe(),
            "noise_check": {**variants["check"], "steps_below": variants["steps_below"]},
            "description": (f"log-likelihood ratio over the {p.scheme.describe()['name']} sampler's law after whitening "
                            f"with {scorer.whitening}" + ("" if scorer.exact else " (an approximation: valid, less powerful)")
                            + f"; method {scorer.method}"),
        }
    else:
        scores = np.concatenate([r.scores_bb for r in runs_out])
        score_info = {"method": "loss decrease", "description": "loss of the initial model minus loss of the final "
                      "model on each canary (higher: more likely included)"}

    mech_ref = None
    if R == 1:
        if white_box:
            tests = preregister(scorer, canaries=m, delta=d, confidence=conf, seed=seed)
            res = tests.audit(variants, coins, d, conf)
            selection = f"{tests.describe()}; the bound is from {res.selection}"
            if trials:
                vals = [mechanism_audit(p.strategy, p.scheme, p.noise_multiplier, d, canaries=m, num_examples=N,
                                        seed=seed * 1000 + t, confidence=conf, tests=tests, scorer=scorer).epsilon_lower
                        for t in range(min(trials, 10))]
                mech_ref = {"median": float(np.median(vals)), "trials": len(vals),
                            "what": "the same audit on the mechanism alone (numpy simulation, no training code)"}
        else:
            res = _stats.audit_one_run(scores, coins, d, conf)
            selection = res.selection
        stats_d = {**res.to_dict(), "selection": selection}
        lower, bound = res.epsilon_lower, res.bound
    else:
        if white_box:
            k = min(N, 400)  # (canaries of one simulated run: only their scores' marginal law matters here)
            sims = [simulate_released(p.strategy, p.scheme, p.noise_multiplier, canaries=k, num_examples=N,
                                      seed=int(np.random.SeedSequence([seed, 5, t]).generate_state(1)[0]))
                    for t in range(max(5, 2000 // k))]
            s_in = np.concatenate([scorer.score(r)[c] for r, c in sims])
            s_out = np.concatenate([scorer.score(r)[~c] for r, c in sims])
            thr = _stats.choose_threshold(s_in, s_out, R, d, conf)
            res = _stats.audit_many_runs(scores, coins, d, conf, threshold=thr)
        else:
            res = _stats.audit_many_runs(scores, coins, d, conf, seed=seed)
        stats_d = res.to_dict()
        lower, bound = res.epsilon_lower, res.bound

    reference = None
    if trials and R == 1:
        ref = ideal_gaussian_reference(certified.epsilon, d, m, conf, trials=trials, seed=seed)
        reference = {**ref.to_dict(), "what": "ideal attacker on the Gaussian mechanism with the claimed (epsilon, "
                     "delta), same canaries and confidence (simulated)"}

    configuration = {
        "strategy": p.strategy.describe(), "scheme": p.scheme.describe(), "noise_multiplier": p.noise_multiplier,
        "max_grad_norm": p.max_grad_norm, "normalizer": p.normalizer, "num_examples": N,
        "real_examples": N - m, "canary_examples": m, "steps": p.steps, "method": certified.method,
    }
    return AuditReport(
        epsilon_lower=float(lower), epsilon_certified=float(certified.epsilon), delta=d, confidence=conf,
        threat_model=threat, canaries=m_total, mode="one-run" if R == 1 else "many-run", bound=bound, runs=R,
        statistics=stats_d, configuration=configuration, score=score_info, reference=reference,
        mechanism_reference=mech_ref, roc=_stats.empirical_roc(scores, coins, points=8, confidence=conf),
        roc_estimates=_stats.empirical_roc(scores, coins, points=24), seed=seed,
        seconds=time.perf_counter() - start, model=model_name, certified=certified,
    )
