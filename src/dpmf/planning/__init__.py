"""The pieces behind ``dpmf plan`` (:mod:`dpmf.planner` is the public entry point).

* :mod:`dpmf.planning.candidates` -- the training run, the candidate configurations as small
  picklable recipes (strategy specs built lazily), the band and min-sep sweeps, the rows;
* :mod:`dpmf.planning.evaluate` -- one candidate: calibrated, or pruned with a sound bound;
* :mod:`dpmf.planning.cache` -- the on-disk cache of finished candidates.
"""
