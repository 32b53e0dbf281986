"""Pure privacy math (numpy/scipy): PBM and Gaussian Rényi DP, composition, conversion to (ε, δ)."""

from vfl_lightning.privacy.analysis.asymptotic import (
    paper_feature_rdp,
    paper_sample_rdp,
    sample_privacy_factor,
)
from vfl_lightning.privacy.analysis.conversion import DEFAULT_ORDERS, expected_uses, rdp_to_dp
from vfl_lightning.privacy.analysis.gaussian import gaussian_rdp, ldp_feature_rdp, ldp_sample_rdp
from vfl_lightning.privacy.analysis.pbm import (
    compose,
    pbm_feature_rdp,
    pbm_rdp,
    pbm_sample_rdp,
    renyi_divergence,
)

__all__ = [
    "DEFAULT_ORDERS",
    "compose",
    "expected_uses",
    "gaussian_rdp",
    "ldp_feature_rdp",
    "ldp_sample_rdp",
    "paper_feature_rdp",
    "paper_sample_rdp",
    "pbm_feature_rdp",
    "pbm_rdp",
    "pbm_sample_rdp",
    "rdp_to_dp",
    "renyi_divergence",
    "sample_privacy_factor",
]
