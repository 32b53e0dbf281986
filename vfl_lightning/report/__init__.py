"""Reports from runs: `python -m vfl_lightning.report DIR... --out OUT` turns results.json +
curve.csv files into the papers' figures, a Markdown report and a W&B Report specification."""

from vfl_lightning.report.runs import ReportError

__all__ = ["ReportError", "make_report"]


def make_report(*args, **kwargs):
    """See :func:`vfl_lightning.report.build.make_report` (imports matplotlib on first use)."""
    from vfl_lightning.report.build import make_report as build

    return build(*args, **kwargs)
