"""The one validator of PBM's (b, β, C), shared by the mechanism and its privacy analysis.

Pure Python, so the mechanism and ``privacy.analysis`` can both import it without extra weight.
"""

from __future__ import annotations


def _real(key: str, value, allowed: str) -> float:
    """``value`` as a float, or one ValueError naming ``key``, the value and ``allowed``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key} must be {allowed}, got {value!r}")
    return float(value)


def check_pbm_parameters(b, beta, C=1.0) -> tuple[int, float, float]:
    """(b, β, C) as PBM needs them: b an integer >= 1, β in (0, 1/4], C > 0.

    The paper's range for β is [0, 1/4]; β = 0 is refused because it releases nothing (p = 1/2
    for every input), has no finite privacy loss to report, and the estimate divides by β.
    """
    integer = "an integer >= 1"
    if not _real("mechanism.b", b, integer).is_integer() or b < 1:
        raise ValueError(f"mechanism.b must be {integer}, got {b!r}")
    beta = _real("mechanism.beta", beta, "a number in (0, 0.25] for PBM")
    if not 0.0 <= beta <= 0.25:
        raise ValueError(f"mechanism.beta must be in (0, 0.25] for PBM, got {beta}")
    if beta == 0.0:
        raise ValueError(
            "mechanism.beta must be in (0, 0.25] for PBM, got 0: beta = 0 makes p = 1/2 for every "
            "input, so the release carries no signal and the estimate (C / (beta b)) "
            "(sum q - b M / 2) divides by zero"
        )
    C = _real("mechanism.C", C, "a number > 0")
    if not C > 0.0:
        raise ValueError(f"mechanism.C must be > 0, got {C}")
    return int(b), beta, C
