"""The one validator of PBM's (b, β, C), shared by the mechanism and its privacy analysis.

Pure Python, so the mechanism and ``privacy.analysis`` can both import it without extra weight.
"""

from __future__ import annotations


def check_pbm_parameters(b, beta, C=1.0) -> tuple[int, float, float]:
    """(b, β, C) as PBM needs them: b an integer >= 1, β in (0, 1/4], C > 0.

    The paper's range for β is [0, 1/4]; β = 0 is refused because it releases nothing (p = 1/2
    for every input), has no finite privacy loss to report, and the estimate divides by β.
    """
    if isinstance(b, bool) or not float(b).is_integer() or int(b) < 1:
        raise ValueError(f"b must be an integer >= 1, got {b!r}")
    beta = float(beta)
    if not 0.0 <= beta <= 0.25:
        raise ValueError(f"beta must be in (0, 0.25] for PBM, got {beta}")
    if beta == 0.0:
        raise ValueError(
            "beta must be in (0, 0.25] for PBM, got 0: beta = 0 makes p = 1/2 for every input, so "
            "the release carries no signal and the estimate (C / (beta b)) (sum q - b M / 2) "
            "divides by zero"
        )
    C = float(C)
    if not C > 0.0:
        raise ValueError(f"C must be > 0, got {C}")
    return int(b), beta, C
