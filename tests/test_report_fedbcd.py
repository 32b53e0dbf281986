"""The FedBCD report's two rounds to target: the first crossing and the round from which the
curve stays at the target, each with mean ± sample standard deviation over seeds."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from conftest import algo_report_config

from vfl_lightning.report.aggregate import rounds_to_stay
from vfl_lightning.report.document import Context
from vfl_lightning.report.recipe_fedbcd import fedbcd
from vfl_lightning.report.runs import Group, Run


def run(values: list[float], *, first: int | None, Q: int = 1, metric: str = "val/auroc") -> Run:
    curve = [{"comm/rounds": float(r + 1), metric: v} for r, v in enumerate(values)]
    results = {
        "algo": "fedbcd",
        "data": "mnist_small",
        "target_metric": metric,
        "target_value": 0.9,
        "rounds_to_target": first,
        metric: values[-1],
        "comm/rounds": float(len(values)),
    }
    config = {**algo_report_config("fedbcd"), "algo": {"local_steps": Q, "mu": 0.0}}
    return Run(Path("."), results, curve, config=config)


@pytest.mark.parametrize(
    ("values", "mode", "expected"),
    [
        ([0.5, 0.91, 0.89, 0.92, 0.95], "max", 4.0),  # crosses at 2, dips at 3, stays from 4
        ([0.95, 0.96], "max", 1.0),
        ([0.5, 0.95, 0.85], "max", math.nan),  # ends below: never stays
        ([1.0, 0.4, 0.6, 0.3], "min", 4.0),  # a loss target: <=
    ],
)
def test_rounds_to_stay_is_the_round_after_the_last_miss(values, mode, expected):
    found = rounds_to_stay(
        run(values, first=None), "val/auroc", 0.5 if mode == "min" else 0.9, mode
    )
    assert found == expected or (math.isnan(found) and math.isnan(expected))


def test_fedbcd_table_gives_both_rounds_to_target_over_seeds():
    seeds = [
        run([0.5, 0.91, 0.89, 0.92], first=2, Q=3),  # stays from 4
        run([0.5, 0.7, 0.93, 0.94], first=3, Q=3),  # stays from 3
    ]
    never = [run([0.5, 0.95, 0.8], first=2, Q=1)]  # crosses, then ends below
    groups = [Group("fedbcd Q=3", {}, seeds), Group("fedbcd Q=1", {}, never)]
    ctx = Context(seeds + never, groups, "comm/rounds", "val/auroc", "FedBCD")
    section = fedbcd(ctx)
    lines = [line for line in section.tables[0].splitlines() if line.startswith("| FedBCD")]
    header = section.tables[0].splitlines()[0]
    assert "rounds to target (first crossing)" in header
    assert "rounds to target (stays from)" in header
    by_q = {line.split(" | ")[1]: line for line in lines}
    assert "| 2.5 ± 0.7 | 2, 3 | 3.5 ± 0.7 | 4, 3 |" in by_q["3"]
    assert "| 2.0 | 2 | – | never |" in by_q["1"]
    assert [stem for stem, _, _ in section.figures] == [
        "fedbcd_rounds_vs_q",
        "fedbcd_metric_vs_rounds",
    ]


def test_each_learning_rate_gets_its_own_row_and_series():
    def at(lr: float, Q: int, first: int) -> Run:
        found = run([0.5, 0.95], first=first, Q=Q)
        found.config["optimizer"] = {"lr": lr}
        return found

    groups = [
        Group("fedbcd Q=1 lr=0.1", {}, [at(0.1, 1, 2)]),
        Group("fedbcd Q=5 lr=0.1", {}, [at(0.1, 5, 2)]),
        Group("fedbcd Q=5 lr=0.05", {}, [at(0.05, 5, 1)]),
    ]
    runs = [r for g in groups for r in g.runs]
    section = fedbcd(Context(runs, groups, "comm/rounds", "val/auroc", "FedBCD"))
    header, _, *rows = section.tables[0].splitlines()
    assert "| η0 |" in header
    # Q = 5 appears once per rate, each row naming its rate
    assert sorted(line.split(" | ")[3] for line in rows if line.split(" | ")[1] == "5") == [
        "0.05",
        "0.1",
    ]
    # one rate alone: no η0 column
    alone = fedbcd(Context(runs[:2], groups[:2], "comm/rounds", "val/auroc", "FedBCD"))
    assert "η0" not in alone.tables[0].splitlines()[0]
