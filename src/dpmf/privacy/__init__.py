"""Privacy-loss math that knows nothing of matrices or samplers (the bottom floor).

* :mod:`~dpmf.privacy.pld` - PLDs over dp_accounting, both adjacency directions, pessimistic;
* :mod:`~dpmf.privacy.gaussian_plds` - Gaussian and Poisson-subsampled Gaussian PLDs;
* :mod:`~dpmf.privacy.mixture` - fast mixture-of-Gaussians PLDs (MMCC's building block);
* :mod:`~dpmf.privacy.product_mixtures` - sums of independent Bernoulli-weighted sensitivities;
* :mod:`~dpmf.privacy.rdp` - Rényi DP of the subsampled Gaussian and its conversion;
* :mod:`~dpmf.privacy.gdp` - mu-GDP <-> (epsilon, delta), exact Gaussian mechanism;
* :mod:`~dpmf.privacy.calibration` - smallest noise / largest step count for a target;
* :mod:`~dpmf.privacy.tradeoff` - f-DP: the TPR-at-FPR curve of a PLD, GDP or (epsilon, delta), composition.
"""

from typing import TYPE_CHECKING

from dpmf._lazy import attach_stub

__getattr__, __dir__, __all__ = attach_stub(__name__, __file__, globals())

if TYPE_CHECKING:  # pragma: no cover - the public names (imported on first use: dpmf._lazy.attach_stub)
    from dpmf.privacy.calibration import CalibrationResult, largest_count, smallest_noise
    from dpmf.privacy.gaussian_plds import gaussian, subsampled_gaussian
    from dpmf.privacy.gdp import gaussian_delta, gaussian_epsilon, gdp_delta, gdp_epsilon, gdp_mu
    from dpmf.privacy.mixture import GaussianMixture, mixture_of_gaussians
    from dpmf.privacy.pld import PrivacyLossDistribution, from_probability_mass_functions
    from dpmf.privacy.product_mixtures import GridDistribution, product_mixture
    from dpmf.privacy.random_sensitivity import group_dpsgd, last_iterate_linear
    from dpmf.privacy.rdp import (
        DEFAULT_ORDERS, epsilon_subsampled_gaussian_rdp, gaussian_rdp, rdp_to_delta, rdp_to_epsilon,
        subsampled_gaussian_rdp,
    )
    from dpmf.privacy.tradeoff import (
        PrivacyCurve, TradeOff, epsilon_delta_pld, tpr_epsilon_delta, tpr_from_pld, tpr_gdp,
    )
