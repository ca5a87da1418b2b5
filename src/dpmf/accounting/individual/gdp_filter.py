"""Gaussian-DP filters and odometers for fully adaptive compositions.

Koskela, Tobaben, Honkela, *Individual Privacy Accounting with Gaussian Differential Privacy*
(ICLR 2023; ``notes/individual-accounting.md``). Main theorem (fully adaptive composition): if the
per-step GDP parameters ``mu_m`` may depend on earlier outputs but ``sum_m mu_m^2 <= B^2`` almost
surely, the whole run is ``B``-GDP, i.e. ``(eps, delta(eps))``-DP for every ``eps >= 0`` with

    delta(eps) = Phi(-eps/B + B/2) - exp(eps) Phi(-eps/B - B/2)         (C.2)

This is tight for Gaussian mechanisms, where Rényi filters (Feldman & Zrnic 2021) lose the
RDP -> (eps, delta) conversion.

* :class:`GDPFilter` is Algorithm 2 (one budget for the whole run);
* :class:`GDPOdometer` is App. C.5 (running bound, budget released in blocks of ``Delta``);
* :class:`IndividualGDPLedger` is Algorithm 1, vectorized: one running ``sum mu^2`` per example;
  an example whose next step would exceed ``B^2`` is left out of that step (its effective mu is 0).
  Guarantees are for the remove relation (add/remove one example), both directions.

For private GD with clip norm ``C`` and noise ``N(0, sigma^2 C^2 I)``, example ``i`` has
``mu_j^(i) = min(||g_i||, C) / (sigma C)`` (App. C.2): a full (clipped) gradient costs ``1/sigma``.
"""

from __future__ import annotations

import json
import math
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpmf import validation as _v
from dpmf._version import __version__
from dpmf.errors import InvalidParameterError
from dpmf.files import check_output_file, read_npz, reading, write_npz
from dpmf.privacy.gdp import gdp_delta, gdp_epsilon, gdp_epsilon_array

LEDGER_KIND = "dpmf.individual.gdp_ledger"


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidParameterError(f"steps must be an integer >= 0, got {value!r}")
    return value


def mu_array(name: str, mu, size: int | None = None) -> np.ndarray:
    arr = np.asarray(mu, dtype=np.float64)
    if arr.ndim != 1:
        raise InvalidParameterError(f"{name} must be a 1-d array, got shape {arr.shape}")
    if size is not None and arr.size != size:
        raise InvalidParameterError(f"{name} must have one entry per example ({size}), got {arr.size}")
    if arr.size:
        # two reductions instead of elementwise masks: NaN/inf poison the sum, negatives the min
        low = arr.min()
        if np.isnan(low) or not np.isfinite(arr.sum()):
            raise InvalidParameterError(f"{name} must be finite (found NaN or inf)")
        if low < 0:
            raise InvalidParameterError(f"{name} must be >= 0, got min {low!r}")
    return arr


@dataclass
class GDPFilter:
    """Algorithm 2: run steps while ``sum mu_m^2 <= B^2``; the run is ``budget``-GDP.

    ``mu_m`` may be chosen adaptively (it must be known before step m is run).
    """

    budget: float
    spent_sq: float = 0.0
    steps: int = 0
    halted: bool = False

    def __post_init__(self) -> None:
        self.budget = _v.positive("budget", self.budget)

    def try_spend(self, mu: float) -> bool:
        """Admit a step of GDP parameter ``mu`` if it fits; once refused, the filter stays halted."""
        mu = _v.non_negative("mu", mu)
        if self.halted:
            return False
        new = self.spent_sq + mu * mu
        if new > self.budget**2:
            self.halted = True
            return False
        self.spent_sq, self.steps = new, self.steps + 1
        return True

    @property
    def spent_mu(self) -> float:
        return math.sqrt(self.spent_sq)

    def epsilon(self, delta: float) -> float:
        """The guarantee of the whole run (budget ``B``), whatever happens next."""
        return gdp_epsilon(self.budget, delta)

    def delta(self, epsilon: float) -> float:
        return gdp_delta(self.budget, epsilon)


@dataclass
class GDPOdometer:
    """App. C.5: a running GDP bound. Steps fill blocks of budget ``block``; after ``m`` blocks
    have been opened the released outputs are ``block * sqrt(m)``-GDP."""

    block: float
    blocks: int = 0
    in_block_sq: float = 0.0

    def __post_init__(self) -> None:
        self.block = _v.positive("block", self.block)

    def spend(self, mu: float) -> float:
        """Record a step; returns the current GDP bound. A single step must fit in one block."""
        mu = _v.non_negative("mu", mu)
        if mu > self.block:
            raise InvalidParameterError(f"mu must be <= the odometer block {self.block!r}, got {mu!r}")
        if self.blocks == 0 or self.in_block_sq + mu * mu > self.block**2:
            self.blocks += 1
            self.in_block_sq = 0.0
        self.in_block_sq += mu * mu
        return self.mu_bound

    @property
    def mu_bound(self) -> float:
        return self.block * math.sqrt(self.blocks)

    def epsilon(self, delta: float) -> float:
        return 0.0 if self.blocks == 0 else gdp_epsilon(self.mu_bound, delta)


@dataclass
class IndividualGDPLedger:
    """Algorithm 1 for ``num_examples`` examples, vectorized (float64, O(N) memory).

    ``step(mu)`` takes each example's GDP parameter for the coming step and returns the
    *effective* mu: ``mu_i`` where it fits the remaining budget, 0 where it does not (the example
    is left out of that step). With ``exhaust_budget=True`` an example that does not fit instead
    spends exactly its remaining budget (its gradient is scaled down to match; F&Z Alg. 3, tight
    per Remark 3). With ``permanent_drop=True`` an example refused once never returns. The
    invariant ``spent_sq <= budget**2`` holds for every example after every step.
    """

    num_examples: int
    budget: float
    noise_multiplier: float | None = None
    permanent_drop: bool = False
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    spent_sq: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    dropped: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    last_active: np.ndarray = field(default=None, repr=False)  # type: ignore[assignment]
    steps: int = 0

    def __post_init__(self) -> None:
        self.num_examples = _v.positive_int("num_examples", self.num_examples)
        self.budget = _v.positive("budget", self.budget)
        if self.noise_multiplier is not None:
            self.noise_multiplier = _v.positive("noise_multiplier", self.noise_multiplier)
        n = self.num_examples
        self.spent_sq = np.zeros(n) if self.spent_sq is None else np.asarray(self.spent_sq, dtype=np.float64)
        self.dropped = np.zeros(n, dtype=bool) if self.dropped is None else np.asarray(self.dropped, dtype=bool)
        self.last_active = (
            np.ones(n, dtype=bool) if self.last_active is None else np.asarray(self.last_active, dtype=bool)
        )
        for name in ("spent_sq", "dropped", "last_active"):
            if getattr(self, name).shape != (n,):
                raise InvalidParameterError(f"{name} must have shape ({n},)")

    @classmethod
    def for_target(
        cls, num_examples: int, epsilon: float, delta: float, **kwargs
    ) -> "IndividualGDPLedger":
        """A ledger whose budget is the largest B with B-GDP => (epsilon, delta)-DP."""
        from dpmf.privacy.gdp import gdp_mu

        return cls(num_examples, gdp_mu(epsilon, delta), **kwargs)

    # ------------------------------------------------------------------ the filter
    def step(self, mu, *, exhaust_budget: bool = False) -> np.ndarray:
        """Admit one step; returns the effective mu per example (see class docstring)."""
        return self._step(mu_array("mu", mu, self.num_examples), exhaust_budget)

    def _step(self, mu: np.ndarray, exhaust_budget: bool) -> np.ndarray:
        """:meth:`step` on an already validated array."""
        b2 = self.budget**2
        new = mu * mu
        new += self.spent_sq
        fits = new <= b2
        if self.permanent_drop:
            fits &= ~self.dropped
        eff = np.where(fits, mu, 0.0)
        spent = np.where(fits, new, self.spent_sq)
        if exhaust_budget:
            partial = ~fits & ~self.dropped
            remaining = np.maximum(b2 - self.spent_sq, 0.0)
            part_mu = np.sqrt(remaining) * (1 - 1e-12)  # stay strictly inside after rounding
            part_mu = np.where(partial, np.minimum(part_mu, mu), 0.0)
            part_new = self.spent_sq + part_mu * part_mu
            ok = partial & (part_new <= b2)
            eff = np.where(ok, part_mu, eff)
            spent = np.where(ok, part_new, spent)
        if self.permanent_drop:
            self.dropped |= ~fits
        self.spent_sq = spent
        self.last_active = eff > 0
        self.steps += 1
        return eff

    # ------------------------------------------------------------------ reporting
    def individual_mu(self) -> np.ndarray:
        """Each example's GDP parameter so far: ``sqrt(sum of its effective mu^2)``."""
        return np.sqrt(self.spent_sq)

    def individual_epsilon(self, delta: float) -> np.ndarray:
        """Each example's epsilon at ``delta`` (exact mu-GDP conversion, safe side)."""
        return gdp_epsilon_array(self.individual_mu(), delta)

    def remaining_full_steps(self) -> np.ndarray:
        """Full-gradient steps (mu = 1/noise_multiplier) each example can still take."""
        if self.noise_multiplier is None:
            raise InvalidParameterError("the ledger has no noise_multiplier; cannot count full steps")
        full = (1.0 / self.noise_multiplier) ** 2
        return np.floor(np.maximum(self.budget**2 - self.spent_sq, 0.0) / full * (1 + 1e-12)).astype(np.int64)

    def exhausted(self) -> np.ndarray:
        """Examples that cannot take another full-gradient step (or were dropped)."""
        if self.noise_multiplier is None:
            return self.dropped | ~self.last_active
        return self.dropped | (self.remaining_full_steps() == 0)

    # ------------------------------------------------------------------ persistence
    def metadata(self) -> dict:
        return {
            "kind": LEDGER_KIND,
            "dpmf_version": __version__,
            "run_id": self.run_id,
            "num_examples": self.num_examples,
            "budget": self.budget,
            "noise_multiplier": self.noise_multiplier,
            "permanent_drop": self.permanent_drop,
            "steps": self.steps,
        }

    def save(self, path: str | Path) -> None:
        """Write an ``.npz`` with the arrays and a JSON metadata record (the folder must exist),
        atomically: a failed write leaves the previous ledger whole (:func:`dpmf.files.write_npz`)."""
        check_output_file(path, "path")
        arrays = {"spent_sq": self.spent_sq, "dropped": self.dropped, "last_active": self.last_active,
                  "metadata": np.array(json.dumps(self.metadata()))}
        write_npz(path, arrays, "GDP ledger")

    @classmethod
    def load(cls, path: str | Path, *, run_id: str | None = None) -> "IndividualGDPLedger":
        """Read a ledger; with ``run_id`` refuse a ledger written by another run. A malformed file
        is an :class:`InvalidParameterError` naming it (:mod:`dpmf.files`)."""
        what = "dpmf GDP ledger"
        contents = read_npz(path, what, kind=LEDGER_KIND, required=("spent_sq", "dropped", "last_active"))
        meta, arrays = contents.metadata, contents.arrays
        with reading(path, what):
            if run_id is not None and meta["run_id"] != run_id:
                raise InvalidParameterError(
                    f"{path}: ledger belongs to run {meta['run_id']!r}, expected run {run_id!r}"
                )
            for key in ("spent_sq", "dropped", "last_active"):
                if arrays[key].dtype.kind not in "biuf":
                    raise InvalidParameterError(f"{path}: corrupt ledger ({key} is not numeric)")
            if not np.all(np.isfinite(arrays["spent_sq"])):
                raise InvalidParameterError(f"{path}: corrupt ledger (non-finite spent budget)")
            ledger = cls(
                meta["num_examples"],
                meta["budget"],
                noise_multiplier=meta["noise_multiplier"],
                permanent_drop=bool(meta["permanent_drop"]),
                run_id=str(meta["run_id"]),
                steps=_count(meta["steps"]),
                **{k: arrays[k] for k in ("spent_sq", "dropped", "last_active")},
            )
        if np.any(ledger.spent_sq > ledger.budget**2) or np.any(ledger.spent_sq < 0):
            raise InvalidParameterError(f"{path}: corrupt ledger (spent budget outside [0, B^2])")
        return ledger
