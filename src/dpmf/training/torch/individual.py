"""Individual privacy accounting and filtering for DP-SGD training (Koskela, Tobaben & Honkela,
ICLR 2023, Alg. 1 with App. C.2; ``notes/individual-accounting.md`` §4.1, §4.3).

:class:`IndividualAccounting` attaches an :class:`~dpmf.accounting.individual.IndividualGDPLedger`
to a run of :func:`~dpmf.training.torch.make_private` with the **identity strategy** (DP-SGD: fresh
noise ``N(0, sigma^2 C^2 I)`` every step). At step ``t`` example ``i`` of the batch ``B_t`` spends

    mu_t^(i) = w_i * min(||g_i||, C) / (sigma C)        (0 for examples outside B_t)

of its GDP budget ``B`` (``||g_i||`` its unclipped gradient norm at the parameters of step ``t``,
``DPOptimizer.last_norms``; ``w_i`` its weight below), fed to the ledger through
:func:`~dpmf.accounting.individual.filtered_step`. Every example's ledger entry
``sqrt(sum_t mu_t^(i)^2)`` is its individual privacy loss so far (``mu``-GDP, hence
``individual_epsilon``); with a budget ``B`` smaller than the worst case, an example whose remaining
budget cannot pay one more worst-case step (``1/sigma``) is **exhausted**: from then on its weight is
0 and its gradient is dropped from every batch it is drawn in (filtered DP-SGD).

Usage (the adapter replays the run's batches from the sampler's seed, so it knows the indices):

>>> import torch
>>> from dpmf.sampling import PoissonSampling
>>> from dpmf.strategies import Identity
>>> from dpmf.training.torch import make_private
>>> _ = torch.manual_seed(0)
>>> data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randint(0, 2, (64,)))
>>> model = torch.nn.Linear(4, 2)
>>> model, opt, loader, privacy = make_private(
...     model, torch.optim.SGD(model.parameters(), lr=0.1), data, strategy=Identity(20),
...     sampling=PoissonSampling(0.25, 20), noise_multiplier=4.0, delta=1e-5, max_grad_norm=0.1,
...     loss_fn=torch.nn.functional.cross_entropy, seed=0)
>>> acct = IndividualAccounting(privacy, target_epsilon=2.0)   # each example (2, 1e-5)-DP at most
>>> round((acct.budget / acct.mu_max) ** 2, 2)                 # (B sigma)^2: 4 worst-case steps fit
4.02
>>> for x, y in loader:
...     opt.zero_grad()
...     _ = acct.step(x, y)          # weights -> opt.step(x, y, weights=...) -> observe(last_norms)
>>> eps = acct.individual_epsilon()                            # one epsilon per example
>>> bool(eps.max() <= acct.epsilon()), int(acct.exhausted().sum()), int((eps > 0).sum())
(True, 47, 62)

or, in a custom loop (micro-batches: slice the weights with the batch)::

    idx = acct.batch_indices(); w = acct.weights(idx)
    opt.step(x, y, weights=w); acct.observe(idx, opt.last_norms, w)

Soundness (what may depend on the data, and why this order):

* **The weight is fixed before the step's gradients are seen.** ``w_i`` is 1 if
  ``spent_i + (1/sigma)^2 <= B^2`` and 0 otherwise: a function of example ``i``'s own ledger, i.e.
  of its past norms (functions of past released models and of ``x_i``) and past participation,
  never of the current step's data or of other examples. The realized ``mu_t^(i) <= 1/sigma`` then
  always fits, so the ledger never refuses a step that was already taken, and the invariant
  ``spent_i <= B^2`` of Alg. 1 holds. (Exact Alg. 1 would admit with the realized ``mu``; this
  pre-check is the stricter, simpler filter and loses less than one worst-case step of budget.)
* **Individual guarantee.** Under zero-out adjacency (DESIGN.md) the participation of every
  example is data-independent randomness, the same in both neighbouring runs; conditional on it
  (revealing it only weakens the claim), step ``t`` is a Gaussian mechanism whose sensitivity to
  example ``i`` is ``w_i min(||g_i||, C(1 - margin))`` and whose parameter ``mu_t^(i)`` is known
  before the step. The individual filter theorem (Thm-IF, via fully adaptive composition) makes
  every example ``B``-GDP, whatever the data: that is the guarantee (:meth:`epsilon`). The realized
  ``sqrt(spent_i) <= B`` (:meth:`individual_mu`, :meth:`individual_epsilon`) is the paper's
  individual accounting, a data-dependent report rather than a guarantee fixed in advance. No
  amplification is claimed: this is private-GD accounting of the steps an example joined.
* **The plan's report still certifies the run.** Every contribution still has norm ``<= C``, and
  its weight depends only on the example's own history. For Poisson sampling (and cyclic Poisson,
  given the example's group) participation at a step is independent of the past, so conditional on
  the past each step is a mixture over that history of subsampled Gaussians with shifts ``<= C``,
  dominated by the worst one (joint convexity of the hockey-stick divergence, both directions).
  For balls-in-bins (one slot, reused) and fixed order an example's past participations are
  determined by the step at which it participates, so its contribution is a function of past outputs and the step, as in
  ordinary DP-SGD. b-min-sep and multi-attribution sampling fit neither argument and are refused.
* **Correlated noise is refused**: with ``C != I`` a step's noise is correlated with the noise of
  earlier steps, so a step is not a fresh Gaussian mechanism given the past and the per-step GDP
  parameter above is not valid (individual filtering across correlated steps is open; notes §6.1).

Data parallel runs (``distributed=True``) are refused for now: each rank sees only its shard's norms.
"""

from __future__ import annotations

import math

import numpy as np

from dpmf import validation as _v
from dpmf.accounting.individual.filtered_step import filtered_step
from dpmf.accounting.individual.gdp_filter import IndividualGDPLedger
from dpmf.errors import InvalidParameterError, NumericalError, UnsupportedConfigurationError
from dpmf.privacy.gdp import gdp_epsilon, gdp_mu
from dpmf.sampling.schemes import BallsInBinsSampling, CyclicPoissonSampling, FixedOrderSampling, PoissonSampling
from dpmf.strategies.identity import Identity
from dpmf.training.torch._deps import require_torch
from dpmf.training.torch.data import SchemeBatchSampler

torch = require_torch()

__all__ = ["IndividualAccounting", "SUPPORTED_SCHEMES"]

#: Sampling schemes under which filtering keeps the plan's report valid (module docstring).
SUPPORTED_SCHEMES = (PoissonSampling, CyclicPoissonSampling, BallsInBinsSampling, FixedOrderSampling)


class IndividualAccounting:
    """A per-example GDP ledger and filter attached to a DP-SGD run (module docstring).

    Args:
        privacy: the :class:`~dpmf.training.torch.Privacy` of :func:`make_private` (its plan,
            optimizer and sampler); the strategy must be :class:`~dpmf.strategies.Identity`.
        budget: the per-example GDP budget ``B`` (``mu``); or
        target_epsilon: the per-example budget as ``(target_epsilon, delta)``-DP (``B`` the largest
            ``mu`` whose ``mu``-GDP curve meets it; ``delta`` defaults to the plan's); or
        ledger: a saved :class:`IndividualGDPLedger` of this run (``IndividualGDPLedger.load``) to
            resume with, at the step the run resumes at.
        With none of them the ledger only accounts: ``B`` is the worst case of the whole run
        (``sqrt(steps) / sigma``), so no example is ever filtered.

    Raises :class:`~dpmf.errors.UnsupportedConfigurationError` for a non-identity strategy, an
    unsupported sampling scheme, or a distributed run.
    """

    def __init__(self, privacy, *, budget: float | None = None, target_epsilon: float | None = None,
                 delta: float | None = None, ledger: IndividualGDPLedger | None = None) -> None:
        plan = privacy.run_spec
        if not isinstance(plan.strategy, Identity):
            raise UnsupportedConfigurationError(
                f"individual accounting needs the identity strategy (DP-SGD), got "
                f"{type(plan.strategy).__name__}: with correlated noise C^-1 z a step's noise depends on "
                "earlier steps' noise, so a step is not a fresh Gaussian mechanism given the past and the "
                "per-step GDP parameter min(||g||, C)/(sigma C) of the individual filter is not valid"
            )
        if not isinstance(plan.scheme, SUPPORTED_SCHEMES):
            names = ", ".join(c.__name__ for c in SUPPORTED_SCHEMES)
            raise UnsupportedConfigurationError(
                f"individual filtering is supported with {names}, not {type(plan.scheme).__name__}: under "
                "b-min-sep (and multi-attribution) sampling an example's participation depends on its own "
                "past participation, on which the filter's weights also depend, and the plan's amplified "
                "report is not proved to cover that"
            )
        if isinstance(plan.scheme, BallsInBinsSampling) and not plan.scheme.reused_single_slot:
            raise UnsupportedConfigurationError(
                f"individual filtering is supported with balls-in-bins only for one slot reused every epoch, not "
                f"num_selected={plan.scheme.num_selected}, fresh_slots={plan.scheme.fresh_slots}: then an example's "
                "past participations are not determined by the step at which it participates (other slots, other "
                "epochs' draws), so the argument of this module does not apply and is not proved"
            )
        if getattr(privacy.optimizer, "distributed", False):
            raise UnsupportedConfigurationError(
                "individual accounting of a distributed run is not supported yet: each rank sees only "
                "the gradient norms of its shard, while every rank's ledger must see the whole batch"
            )
        given = [name for name, v in (("budget", budget), ("target_epsilon", target_epsilon), ("ledger", ledger))
                 if v is not None]
        if len(given) > 1:
            raise InvalidParameterError(f"pass at most one of budget, target_epsilon and ledger, got {given}")
        if delta is not None and target_epsilon is None:
            raise InvalidParameterError("delta goes with target_epsilon (the budget as an (epsilon, delta) pair)")
        self.privacy, self.plan = privacy, plan
        self.optimizer = privacy.optimizer
        self.clip_norm = float(plan.max_grad_norm)
        self.noise_multiplier = float(plan.noise_multiplier)
        m = plan.num_examples
        # the worst-case step, computed exactly as filtered_step computes mu (so a pre-check with it
        # bounds the realized mu in floating point too: both products are monotone)
        self.mu_max = float(np.float64(self.clip_norm) * (1.0 / (self.noise_multiplier * self.clip_norm)))
        if ledger is not None:
            if not isinstance(ledger, IndividualGDPLedger):
                raise InvalidParameterError(f"ledger must be an IndividualGDPLedger, got {type(ledger).__name__}")
            if ledger.num_examples != m:
                raise InvalidParameterError(f"the ledger has {ledger.num_examples} examples, the plan {m}")
            if ledger.steps != privacy.steps_done:
                raise InvalidParameterError(
                    f"the ledger has recorded {ledger.steps} steps but the run is at step {privacy.steps_done}: "
                    "save and load the ledger with the training checkpoint of the same step"
                )
            if ledger.noise_multiplier is None:
                ledger.noise_multiplier = self.noise_multiplier
            elif not math.isclose(ledger.noise_multiplier, self.noise_multiplier, rel_tol=1e-12):
                raise InvalidParameterError(
                    f"the ledger's noise_multiplier={ledger.noise_multiplier!r} differs from the plan's "
                    f"{self.noise_multiplier!r}"
                )
            self.ledger = ledger
            self.filtering = True
        else:
            if budget is not None:
                b, self.filtering = _v.positive("budget", budget), True
            elif target_epsilon is not None:
                d = plan.delta if delta is None else _v.open_unit("delta", delta)
                b, self.filtering = gdp_mu(_v.positive("target_epsilon", target_epsilon), d), True
            else:  # account only: every step of the run fits (slack for the float sum of <= steps terms)
                b, self.filtering = math.sqrt(plan.steps) * self.mu_max * (1.0 + 1e-9), False
            self.ledger = IndividualGDPLedger(m, b, noise_multiplier=self.noise_multiplier)
        if self.ledger.budget**2 < self.mu_max * self.mu_max:
            raise InvalidParameterError(
                f"the per-example budget B={self.ledger.budget!r} is below one worst-case step "
                f"1/noise_multiplier={self.mu_max!r}: no example could ever be used; raise the budget "
                "(or target_epsilon) or the noise multiplier"
            )
        self._shadow = SchemeBatchSampler(plan.scheme, m, seed=privacy.sampler.seed)
        self._cached: tuple[int, np.ndarray] | None = None

    # ------------------------------------------------------------------ the batches
    def batch_indices(self) -> np.ndarray:
        """The example indices of the coming step (``privacy.steps_done``), in the loader's order:
        the scheme's batch, replayed from the run's sampler seed."""
        step = self.privacy.steps_done
        self.plan.check_step(step)
        if self._cached is not None and self._cached[0] == step:
            return self._cached[1].copy()
        if self._shadow.steps_done != step:
            self._shadow.load_state_dict(self.privacy.sampler.state_dict(steps_done=step))
        batch = np.asarray(next(iter(self._shadow)), dtype=np.int64)
        self._cached = (step, batch)
        return batch.copy()

    # ------------------------------------------------------------------ the filter
    def admissible(self) -> np.ndarray:
        """Examples whose remaining budget pays one more worst-case step (bool, one per example)."""
        led = self.ledger
        new = np.full(led.num_examples, self.mu_max * self.mu_max)
        new += led.spent_sq  # the ledger's own test: mu*mu + spent <= B^2
        ok = new <= led.budget**2
        if led.permanent_drop:
            ok &= ~led.dropped
        return ok

    def exhausted(self) -> np.ndarray:
        """Examples filtered out from now on (``~admissible()``; once exhausted, always exhausted)."""
        return ~self.admissible()

    def weights(self, batch_indices) -> "torch.Tensor":
        """Per-example weights (float64, 1 or 0) for ``optimizer.step(..., weights=...)``: 0 for the
        exhausted examples of the batch. Depends only on the ledger, never on this step's data."""
        idx = self._indices(batch_indices)
        return torch.as_tensor(self.admissible()[idx].astype(np.float64))

    def observe(self, batch_indices, norms, weights=None) -> np.ndarray:
        """Charge the step just taken: ``mu_i = w_i min(norm_i, C) / (sigma C)`` for the batch
        (``norms``: ``optimizer.last_norms``, in batch order; ``weights``: those passed to the step,
        default all 1). Call once per optimizer step, right after it. Returns the charged ``mu``
        (batch order). A non-finite norm (the clipper dropped that gradient) is charged as ``C``."""
        idx = self._indices(batch_indices)
        if self.privacy.steps_done != self.ledger.steps + 1:
            raise InvalidParameterError(
                f"observe() records one optimizer step, right after it: the ledger has {self.ledger.steps} "
                f"steps and the run {self.privacy.steps_done}"
            )
        n = torch.as_tensor(norms).detach().to("cpu", torch.float64).numpy() if norms is not None else None
        if n is None or n.shape != idx.shape:
            raise InvalidParameterError(
                f"norms must have one entry per example of the batch ({idx.size}), got "
                f"{None if n is None else n.shape}"
            )
        w = np.ones(idx.size) if weights is None else torch.as_tensor(weights).detach().to("cpu", torch.float64).numpy()
        if w.shape != idx.shape or not np.all(np.isfinite(w)) or np.any(w < 0) or np.any(w > 1):
            raise InvalidParameterError(f"weights must be {idx.size} numbers in [0, 1] (those given to the step)")
        if np.any((w > 0) & ~self.admissible()[idx]):
            raise InvalidParameterError(
                "an exhausted example had a nonzero weight: take the step with weights(batch_indices), "
                "which are 0 for exhausted examples (the ledger cannot charge an overspent budget)"
            )
        c = self.clip_norm
        clipped = np.where(np.isfinite(n), np.minimum(n, c), c)  # pessimistic for dropped NaN/inf gradients
        full = np.zeros(self.ledger.num_examples)
        full[idx] = w * clipped  # <= C, so filtered_step's min(., C) keeps it: mu_i = w_i min(n_i, C)/(sigma C)
        charged = full[idx] * (1.0 / (self.noise_multiplier * c))
        res = filtered_step(self.ledger, full, clip_norm=c, noise_multiplier=self.noise_multiplier,
                            normalizer=self.plan.normalizer)
        if not np.array_equal(res.mu[idx], charged):
            raise NumericalError("the ledger refused a step that was already taken (please report this)")
        return charged

    def step(self, inputs, targets=None):
        """One filtered private step on the coming batch: weights, ``optimizer.step``, observe.
        ``inputs`` must be the loader's batch of this step (checked by size)."""
        idx = self.batch_indices()
        batch = (inputs[0] if isinstance(inputs, (tuple, list)) else inputs).shape[0]
        if batch != idx.size:
            raise InvalidParameterError(
                f"the batch has {batch} examples but step {self.privacy.steps_done} of the scheme has {idx.size}: "
                "pass the data loader's batches in order"
            )
        w = self.weights(idx)
        out = self.optimizer.step(inputs, targets, weights=w)
        self.observe(idx, self.optimizer.last_norms, w)
        return out

    # ------------------------------------------------------------------ reporting
    @property
    def budget(self) -> float:
        """The per-example GDP budget ``B``."""
        return self.ledger.budget

    def individual_mu(self) -> np.ndarray:
        """Each example's GDP parameter so far, ``sqrt(sum_t mu_t^(i)^2)`` (``<= budget``)."""
        return self.ledger.individual_mu()

    def individual_epsilon(self, delta: float | None = None) -> np.ndarray:
        """Each example's epsilon at ``delta`` (default the plan's) from its ``mu``-GDP curve."""
        return self.ledger.individual_epsilon(self.plan.delta if delta is None else delta)

    def epsilon(self, delta: float | None = None) -> float:
        """The filter's per-example guarantee (``budget``-GDP) at ``delta``: no example exceeds it."""
        return gdp_epsilon(self.budget, self.plan.delta if delta is None else delta)

    def summary(self, delta: float | None = None) -> dict:
        """Counts and quantiles of the individual epsilons (``dpmf individual report``'s summary)."""
        from dpmf.accounting.individual.report import summarize

        out, _ = summarize(self.ledger, self.plan.delta if delta is None else delta)
        out["filtering"] = self.filtering
        out["exhausted"] = int(self.exhausted().sum())
        out["exhausted_fraction"] = float(self.exhausted().mean())
        return out

    # ------------------------------------------------------------------ helpers
    def _indices(self, batch_indices) -> np.ndarray:
        idx = np.asarray(batch_indices.cpu() if isinstance(batch_indices, torch.Tensor) else batch_indices)
        if idx.ndim != 1 or (idx.size and not np.issubdtype(idx.dtype, np.integer)):
            raise InvalidParameterError("batch_indices must be a 1-d sequence of example indices")
        idx = idx.astype(np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self.ledger.num_examples):
            raise InvalidParameterError(f"batch_indices must lie in 0..{self.ledger.num_examples - 1}")
        if np.unique(idx).size != idx.size:
            raise InvalidParameterError("batch_indices must not repeat an example within a step")
        return idx
