"""The audit report recipe on runs built in memory: one figure per audit present, a table whose
numbers are the runs' mean bound and accountant ε, ∞ for a release without noise, and the
recipe chosen automatically for runs that audited."""

from __future__ import annotations

from pathlib import Path

import pytest

from vfl_lightning.report.document import Context
from vfl_lightning.report.recipe_audit import audit
from vfl_lightning.report.recipes import check_recipe, choose_recipe
from vfl_lightning.report.runs import ReportError, Run, group_runs


def run(algo: str, seed: int, bound: float, accountant) -> Run:
    results = {
        "algo": algo,
        "seed": seed,
        "test/acc": 0.5,
        "audit/canary/eps_lower": bound,
        "audit/canary/eps_accountant": accountant,
        "audit/canary/eps_lower_max": 3.5,
        "audit/canary/guess_acc": 0.75,
        "audit/canary/n": 160,
    }
    return Run(Path(f"/runs/{algo}{seed}"), results, [], {"algo": algo})


def test_audit_recipe_tables_and_figures():
    runs = [run("pbm", 0, 1.0, 37.0), run("pbm", 1, 2.0, 37.0), run("npq", 0, 3.5, "inf")]
    groups = group_runs(runs)
    section = audit(Context(runs, groups, "epoch", "val/acc", "digits"))
    assert [stem for stem, _, _ in section.figures] == ["audit_canary"]
    rows = {
        line.split(" | ")[0].strip("| "): line.split(" | ")
        for line in section.tables[0].splitlines()
    }
    assert rows["pbm"][4:7] == ["37 ± 0", "1.50 ± 0.71", "0.04 ± 0.02"]
    assert rows["npq"][4:7] == ["∞", "3.50", "–"]
    assert choose_recipe(runs) == "audit"


def test_audit_recipe_reads_every_audit_from_the_results():
    """No list of audits: an audit the library does not know is drawn and tabulated by name."""
    runs = [run("pbm", 0, 1.0, 2.0)]
    runs[0].results |= {"audit/mine/eps_lower": 0.5, "audit/mine/eps_accountant": 4.0}
    section = audit(Context(runs, group_runs(runs), "epoch", "val/acc", "digits"))
    assert [stem for stem, _, _ in section.figures] == ["audit_canary", "audit_mine"]
    assert "| mine: bound / accountant |" in section.tables[0]


def test_audit_recipe_needs_audited_runs():
    plain = Run(Path("/runs/x"), {"algo": "pbm"}, [], {})
    with pytest.raises(ReportError, match=r"--recipe audit needs runs with an audit"):
        check_recipe("audit", [plain])


def test_seeds_of_message_canaries_pool(tmp_path):
    """Runs that wrote their canaries' scores: the table has their pooled (multi-run) bound."""
    import numpy as np

    from vfl_lightning.privacy.analysis.message_audit import write_scores

    setting = {
        "accounting": "ldp",
        "C": 1.0,
        "sigma": 8.0,
        "width": 16,
        "releases": 2,
        "delta": 1e-5,
        "confidence": 0.95,
        "eps_accountant": 7.09,
    }
    rng = np.random.default_rng(0)
    runs = []
    for seed in (0, 1):
        coins = rng.integers(0, 2, 500)
        scores = (2 * coins - 1) * 1.41 / 2 + rng.standard_normal(500)
        path = tmp_path / f"run{seed}"
        path.mkdir()
        write_scores(path / "audit_canary_message.npz", setting, scores, coins)
        results = {
            "algo": "ldp",
            "seed": seed,
            "audit/canary_message/eps_lower": 2.0,
            "audit/canary_message/eps_accountant": 7.09,
        }
        runs.append(Run(path, results, [], {"algo": "ldp"}))
    section = audit(Context(runs, group_runs(runs), "epoch", "val/acc", "synthetic"))
    assert (
        "| canary_message: pooled bound (runs) | canary_message: pooled / accountant |"
        in (section.tables[0])
    )
    row = next(line for line in section.tables[0].splitlines() if line.startswith("| ldp"))
    assert row.split(" | ")[4].endswith("(2)")
