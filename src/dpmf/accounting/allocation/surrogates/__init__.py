"""The allocation surrogates: Gaussian models of one epoch's slot sums whose covariance dominates the
mechanism's Gram, so that convex functions of their likelihood ratio bound the exact pair's
hockey-stick divergences (design note ``docs/notes/allocation-surrogates.md``).

* :mod:`.protocol` -- the :class:`~.protocol.Surrogate` interface the accountants read;
* :mod:`.quadrature` -- node placement and convex-order spreading shared by the programs;
* the Markov chain: :mod:`.markov_chain` (the surrogate), :mod:`.markov_fit` (fitting and the PSD
  certificate; the argument), :mod:`.markov_ring` (rings and the ranked family),
  :mod:`.markov_programs` (call/put programs, threads, the epsilon search);
* :mod:`.moving_average` -- the band's own moving average;
* ``_markov_compiled``, ``_moving_average_compiled`` -- numba kernels, loaded when a program first runs.
"""
