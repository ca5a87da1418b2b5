"""Empirical privacy audits (issue 25): is a run as private as its report says?

The one package for auditing (torch-free; the torch driver is an adapter on top of it):

* :mod:`dpmf.auditing.bounds` -- the bounds: the statistics that turn guesses into epsilon lower
  bounds (the one-run theorem, Clopper-Pearson over runs, pre-registered guesses); pure math.
* :mod:`dpmf.auditing.whitebox` -- the scores of the white-box attacker of a correlated-noise run:
  whiten with ``C``, then the likelihood ratio over the sampler's law.
* :mod:`dpmf.auditing.game` -- the games: the white-box game on the mechanism alone (numpy
  simulation), the audit's pre-registered tests, the ideal Gaussian reference.
* :mod:`dpmf.auditing.report` -- :class:`AuditReport`, what an audit returns and prints.
* :mod:`dpmf.auditing.config` -- :class:`AuditConfig`, the options of an audit of a training run.
* :mod:`dpmf.auditing.assess` -- the audit's stages after training: from what the runs released
  (:class:`Released`) to the scores, the bound, the references and the report.
* :mod:`dpmf.training.torch.audit` -- the torch adapter: ``audit_training`` trains with the
  canaries (through the real sampler, clipping, noise and optimizer) and calls :func:`assess`.

Every lower bound here is an **empirical lower bound**, never a certificate.
"""

from dpmf.auditing.assess import Released, assess
from dpmf.auditing.config import AuditConfig
from dpmf.auditing.game import WhiteBoxTests, ideal_gaussian_reference, mechanism_audit, preregister, simulate_released
from dpmf.auditing.report import THREAT_MODELS, AuditReport
from dpmf.auditing.whitebox import WhiteBoxScorer, whitening_matrix

__all__ = ["AuditConfig", "AuditReport", "THREAT_MODELS", "Released", "assess", "WhiteBoxScorer", "whitening_matrix",
           "WhiteBoxTests", "preregister", "mechanism_audit", "simulate_released", "ideal_gaussian_reference"]
