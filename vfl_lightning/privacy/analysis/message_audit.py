"""The message-canary audit's bound from its setting and its canaries' scores (pure numpy), for one
run or pooled over several (a multi-run audit: independent runs of one setting, each coin in one
run only, so their canaries together are one audit's canaries).

A ``setting`` (a plain dict, written beside the scores) holds what fixes the hypotheses: the
mechanism's ``accounting`` and parameters (``C``, ``sigma`` for LDP; ``b``, ``beta``,
``num_parties`` for PBM), the embedding ``width`` P, the ``releases`` of the most-released
canary, ``delta``, ``confidence`` and the accountant's ε (``eps_accountant``), which plans the
guesses for PBM.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from vfl_lightning.privacy.analysis.fdp_audit import fdp_lower_bound, planned_guesses
from vfl_lightning.privacy.analysis.tradeoff import GaussianFamily, TradeOffFamily, gaussian_mu
from vfl_lightning.privacy.analysis.tradeoff_pbm import PBMFamily

HYPOTHESIS_KEYS = ("accounting", "C", "sigma", "b", "beta", "num_parties", "width", "releases")
"""What must agree for runs to be pooled (with ``delta`` and ``confidence``)."""


def hypotheses(setting: dict) -> tuple[TradeOffFamily, float]:
    """(the family of trade-off functions the canaries' releases belong to, the μ of the
    Gaussian stand-in that plans the guesses): μ-GDP with μ = 2C√(P·R)/σ under LDP (exactly);
    PBM's worst case over the other parties composed over P·R releases under PBM, planned with
    the μ-GDP of the accountant's ε."""
    releases = int(setting["width"]) * int(setting["releases"])
    if setting["accounting"] == "ldp":
        mu = 2.0 * float(setting["C"]) * releases**0.5 / float(setting["sigma"])
        return GaussianFamily(), mu
    if setting["accounting"] != "pbm":
        raise ValueError(f"no audit hypotheses for accounting {setting['accounting']!r}")
    family = PBMFamily(
        b=int(setting["b"]), num_parties=int(setting["num_parties"]), releases=releases
    )
    return family, gaussian_mu(float(setting["eps_accountant"]), float(setting["delta"]))


def message_canary_bound(
    *, setting: dict, scores: np.ndarray, coins: np.ndarray, guesses: int | None = None
) -> dict:
    """The f-DP one-run bound of canaries with ``scores`` (NaN: never released) and ``coins``:
    ``guesses`` of them (None: planned from the canaries released and the stand-in μ)."""
    released = int(np.isfinite(scores).sum())
    if released == 0:
        return {"eps_lower": 0.0, "guess_acc": None, "n": len(scores), "guesses": 0}
    family, mu = hypotheses(setting)
    confidence = float(setting["confidence"])
    count = guesses or planned_guesses(canaries=released, mu=mu, confidence=confidence)
    return fdp_lower_bound(
        scores=scores,
        coins=coins,
        family=family,
        delta=float(setting["delta"]),
        guesses=[min(count, released)],
        confidence=confidence,
    )


def write_scores(path: str | Path, setting: dict, scores: np.ndarray, coins: np.ndarray) -> None:
    """One run's canaries (scores, coins) and setting, for pooling later."""
    np.savez(
        Path(path),
        scores=np.asarray(scores, dtype=np.float64),
        coins=np.asarray(coins, dtype=np.int8),
        setting=np.array(json.dumps(setting, sort_keys=True)),
    )


def read_scores(path: str | Path) -> tuple[dict, np.ndarray, np.ndarray]:
    with np.load(Path(path)) as stored:
        setting = json.loads(str(stored["setting"]))
        return setting, stored["scores"], stored["coins"].astype(np.int64)


def pooled_bound(paths: Sequence[str | Path]) -> dict:
    """The bound of the canaries of every run in ``paths`` together (their settings must agree);
    ``runs``: how many."""
    if not paths:
        raise ValueError("pooling needs at least one run's canaries")
    read = [read_scores(path) for path in paths]
    first = read[0][0]
    keys = (*HYPOTHESIS_KEYS, "delta", "confidence")
    for path, (setting, _, _) in zip(paths, read, strict=True):
        differ = [k for k in keys if setting.get(k) != first.get(k)]
        if differ:
            raise ValueError(
                f"{path} was audited with another setting ({', '.join(differ)}): only runs of "
                "one setting pool into one bound"
            )
    scores = np.concatenate([s for _, s, _ in read])
    coins = np.concatenate([c for _, _, c in read])
    bound = message_canary_bound(setting=first, scores=scores, coins=coins)
    return bound | {"runs": len(read), "eps_accountant": first["eps_accountant"]}
