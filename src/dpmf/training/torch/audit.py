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

import dataclasses
import math
import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from dpmf import progress
from dpmf import validation as _v
from dpmf.auditing.assess import Released, assess
from dpmf.auditing.config import DEFAULT_REAL_EXAMPLES, AuditConfig
from dpmf.auditing.game import substream_seed
from dpmf.auditing.report import AuditReport
from dpmf.errors import InvalidParameterError
from dpmf.training.run_spec import RunSpec, build_run_spec
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.engine import make_private

torch = require_torch()

__all__ = ["audit_training", "AuditConfig", "builtin_task", "AuditedModule", "DIRAC_GAIN", "DEFAULT_REAL_EXAMPLES"]

#: Norm of a white-box canary's gradient, in clip norms: far above 1, so clipping decides what the
#: canary contributes (exactly the clip norm), and a run that does not clip shows it.
DIRAC_GAIN = 100.0


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


def _train_once(config: AuditConfig, task: "_Task", plan: RunSpec | None, model, optimizer, coins: np.ndarray,
                seed: int, step_done: Callable[[], None]) -> Released:
    """One training run with ``config.per_run`` canaries, included by ``coins``; what it released."""
    m, white_box = config.per_run, config.white_box
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), 3]))
    cx, cy = _canary_examples(task.dataset, m, white_box, rng, task.canary_data)
    clip = plan.max_grad_norm if plan is not None else config.max_grad_norm
    audited = AuditedModule(model, m, white_box=white_box, gain=DIRAC_GAIN * clip)
    if white_box:
        optimizer.add_param_group({"params": [audited.audit_block], "lr": 0.0, "weight_decay": 0.0})
    data = _AuditData(task.dataset, cx, cy)
    initial = None
    if not white_box:
        initial = _losses(model, cx, cy, task.loss_fn)
    kwargs = dict(loss_fn=_AuditLoss(task.loss_fn, white_box), grad_sample_mode="functorch", seed=int(seed))
    if plan is not None:
        run = make_private(audited, optimizer, data, plan=plan, **kwargs)
    else:
        run = make_private(audited, optimizer, data, **config.privacy_options(), **kwargs)
    opt, loader, privacy = run.optimizer, run.data_loader, run.privacy
    p = privacy.run_spec
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
    if white_box:
        return Released(p, coins, sums=released)
    return Released(p, coins, loss_decrease=initial - _losses(model, cx, cy, task.loss_fn))


# ---------------------------------------------------------------------------- the audit's stages


def _model_factory(model, optimizer, learning_rate: float, builtin_make):
    """``make(run) -> (module, optimizer)``: the built-in MLP with SGD, a user's factory, or the
    user's single module and optimizer (one run only)."""
    if model is None:
        def make(run: int):
            net = builtin_make(10_000 + run)
            return net, torch.optim.SGD(net.parameters(), lr=learning_rate)
        return make
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
        return make
    if callable(model):
        if optimizer is not None:
            raise InvalidParameterError("with model=<factory> the factory returns the optimizer; drop optimizer=")

        def make(run: int):
            out = model(run)
            if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
                raise InvalidParameterError("model(run) must return (module, optimizer)")
            return out
        return make
    raise InvalidParameterError(f"model must be a torch.nn.Module or a factory, got {type(model).__name__}")


@dataclass(frozen=True)
class _Task:
    """What is trained: the real examples, ``make(run) -> (module, optimizer)``, the loss, the
    black-box canaries (or None) and ``name`` (``"built-in"`` or ``"user"``)."""

    dataset: Any
    make: Callable
    loss_fn: Callable
    canary_data: Any
    name: str


def _task(config: AuditConfig) -> _Task:
    """Stage 1: the built-in task (:func:`builtin_task`) or the user's model, dataset and loss."""
    if config.builtin:
        dataset, builtin_make, canary_data = builtin_task(
            config.num_examples or DEFAULT_REAL_EXAMPLES, seed=config.seed,
            canary_features=0 if config.white_box else config.per_run)
        make = _model_factory(None, None, config.learning_rate, builtin_make)
        return _Task(dataset, make, torch.nn.functional.cross_entropy, canary_data, "built-in")
    make = _model_factory(config.model, config.optimizer, config.learning_rate, None)
    return _Task(config.dataset, make, config.loss_fn, config.canary_data, "user")


def _plan(config: AuditConfig, num_examples: int) -> tuple[RunSpec | None, int]:
    """Stage 2: ``(plan, steps)``: the given plan (checked against the audited dataset), one built
    here for many runs (certify once, train many times), or None (``make_private`` builds it)."""
    plan, N, m = config.plan, num_examples, config.per_run
    if plan is not None:
        given = [k for k in ("strategy", "sampling", "noise_multiplier", "target_epsilon")
                 if getattr(config, k) is not None]
        if given:
            raise InvalidParameterError(f"plan= fixes the configuration: do not also pass {', '.join(given)}")
        if not isinstance(plan, RunSpec):
            raise InvalidParameterError(f"plan must be a RunSpec (build_run_spec), got {type(plan).__name__}")
        if plan.num_examples != N:
            raise InvalidParameterError(
                f"the plan is for {plan.num_examples} examples but the audited dataset has {N} "
                f"({N - m} real + {m} canaries): build it with num_examples={N}"
            )
        return plan, plan.steps
    if config.runs > 1:
        if config.strategy is None or config.sampling is None or config.delta is None:
            raise InvalidParameterError("pass strategy, sampling and delta (with noise_multiplier or target_epsilon), "
                                        "or plan=")
        plan = build_run_spec(config.strategy, config.sampling, num_examples=N, delta=config.delta,
                          max_grad_norm=config.max_grad_norm, noise_multiplier=config.noise_multiplier,
                          target_epsilon=config.target_epsilon, accountant=config.accountant,
                          **(config.accountant_options or {}))
        return plan, plan.steps
    if config.sampling is None:
        raise InvalidParameterError("pass sampling= (with strategy, delta and noise_multiplier or target_epsilon)")
    return None, config.sampling.steps


def _train(config: AuditConfig, task: _Task, plan: RunSpec | None, steps: int) -> list[Released]:
    """Stage 3: ``config.runs`` trainings, the coins of each drawn before it; the first run's plan
    serves the others (certified once)."""
    coin_rng = np.random.default_rng(np.random.SeedSequence([config.seed, 1]))
    total = steps * config.runs
    runs = []
    with progress.task(f"audit ({config.threat}): training with canaries", total=total, unit="steps") as bar:
        done = [0]

        def step_done() -> None:
            done[0] += 1
            bar.advance()
            if config.callback is not None:
                config.callback(done[0], total)

        for r in range(config.runs):
            coins = coin_rng.random(config.per_run) < 0.5
            module, opt = task.make(r)
            run = _train_once(config, task, plan, module, opt, coins, substream_seed(config.seed, 2, r), step_done)
            runs.append(run)
            plan = run.plan
    return runs


def audit_training(config: AuditConfig | None = None, /, **options) -> AuditReport:
    """Audit a private training configuration empirically (module docstring).

    Args:
        config: an :class:`~dpmf.auditing.config.AuditConfig`; or its fields as keywords
            (``options``; with ``config`` too, they replace its fields): the configuration as for
            :func:`~dpmf.training.torch.engine.make_private` (``strategy``, ``sampling``, ``delta``,
            ``noise_multiplier`` | ``target_epsilon``, ``max_grad_norm``, ``accountant``,
            ``accountant_options``) or a ``plan`` built for ``len(dataset) + canaries`` examples;
            the audit (``canaries``, ``threat``, ``seed``, ``confidence``, ``runs``,
            ``reference_trials``); the model (``model``, ``optimizer``, ``dataset``, ``loss_fn``,
            ``canary_data``; all ``None``: the built-in task with ``num_examples`` real examples and
            SGD at ``learning_rate``); ``callback(steps_done, steps_total)`` after every step.

    Returns:
        an :class:`~dpmf.auditing.report.AuditReport`: ``epsilon_lower`` (**empirical lower bound**,
        not a certificate), ``epsilon_certified`` (the plan's report), the gap, the references,
        the statistics and a plot of the attack against the report's trade-off curve.
    """
    start = time.perf_counter()
    if config is None:
        config = AuditConfig(**options)
    elif not isinstance(config, AuditConfig):
        raise InvalidParameterError(f"config must be an AuditConfig, got {type(config).__name__}")
    elif options:
        config = dataclasses.replace(config, **options)
    task = _task(config)
    num_examples = len(task.dataset) + config.per_run
    plan, steps = _plan(config, num_examples)
    runs = _train(config, task, plan, steps)
    return assess(config, runs, num_examples=num_examples, model=task.name, start=start)
