"""Report figures a reviewer accepts: one colour family per algo in every figure, identical curves
named, "not reached" drawn, plain log ticks, bars inside the frame, ± only over several seeds."""

from __future__ import annotations

from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
from conftest import algo_report_config

from vfl_lightning.report import charts, figures
from vfl_lightning.report.aggregate import summarize
from vfl_lightning.report.runs import Group, Run


def run(algo: str, accuracies: list[float], **results) -> Run:
    curve = [{"epoch": float(i + 1), "val/acc": a} for i, a in enumerate(accuracies)]
    return Run(Path("."), {"algo": algo, **results}, curve, config=algo_report_config(algo))


def group(label: str, *runs: Run) -> Group:
    return Group(label, {}, list(runs))


def test_an_algo_keeps_its_colour_in_every_figure():
    pbm = group("pbm", run("pbm", [0.1]))
    alone = figures.group_colors([pbm])
    mixed = figures.group_colors(
        [group("npq", run("npq", [0.1])), pbm, group("ldp", run("ldp", [0.1]))]
    )
    assert alone[0] == mixed[1] == figures.algo_color(pbm)
    assert len({tuple(c) for c in mixed}) == 3
    shades = figures.group_colors(
        [group("pbm a", run("pbm", [0.1])), group("pbm b", run("pbm", [0.1]))]
    )
    assert shades[0] != shades[1]  # two groups of one algo: two shades of its family


def test_identical_curves_are_named_and_both_drawn():
    a = group("fedbcd Q=1", run("fedbcd", [0.5, 0.7]))
    b = group("fedbcd_s Q=1", run("fedbcd_s", [0.5, 0.7]))
    fig = figures.curves([a, b], "epoch", ["val/acc"], "t")
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["fedbcd Q=1", "fedbcd_s Q=1 (identical to fedbcd Q=1)"]
    assert fig.axes[0].get_lines()[1].get_linestyle() == ":"
    fig.canvas.draw()  # epochs: whole-number ticks only (no 1.5, 2.5)
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks
    plt.close(fig)


def test_points_mark_never_reached_and_use_plain_log_ticks(tmp_path):
    reached = group("fedbcd Q=5", run("fedbcd", [0.9], rounds_to_target=4, Q=5))
    never = group("fedbcd Q=1", run("fedbcd", [0.5], rounds_to_target=None, Q=1))
    partly = group(
        "fedbcd Q=25",
        run("fedbcd", [0.9], rounds_to_target=2, Q=25),
        run("fedbcd", [0.5], rounds_to_target=None, Q=25),
    )
    entries = [(g, "Q", "rounds_to_target", "filled") for g in (never, reached, partly)]
    fig = charts.points(
        {"FedBCD-p": entries},
        "t",
        "Q",
        "rounds",
        log_x=True,
        log_y=True,
        not_reached=True,
        integer_ticks=True,
    )
    ax = fig.axes[0]
    assert [line.get_marker() for line in ax.get_lines()].count("v") == 1
    legend = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "not reached (top edge)" in legend
    assert "1/2" in [text.get_text() for text in ax.texts]
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "5", "25"]
    y_labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert y_labels and all("10^" not in t and "times" not in t for t in y_labels)
    plt.close(fig)


def test_bars_write_missing_values_and_keep_every_row_inside():
    names = ["npq", "pbm b=2", "pbm b=16"]
    series = {"MB": [summarize([4.0, 5.0]), summarize([None]), summarize([1.0, None])]}
    fig = charts.bars(names, series, "t", "MB", reference=(10.0, "chance"))
    ax = fig.axes[0]
    texts = [t.get_text().strip() for t in ax.texts]
    assert "not reached" in texts and "(1/2)" in texts
    low, high = sorted(ax.get_ylim())
    assert low <= -0.5 and high >= len(names) - 0.5
    assert "chance" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(fig)


@pytest.mark.parametrize(
    ("values", "kwargs", "text"),
    [
        ([0.5], {}, "0.5000"),
        ([0.5, 0.7], {}, "0.6000 ± 0.1414"),
        ([0.00217, 0.00217], {"digits": 3, "significant": True}, "0.00217 ± 0"),
        ([0.002, None], {"digits": 3, "significant": True}, "0.002 (1/2)"),
    ],
)
def test_summary_text(values, kwargs, text):
    assert summarize(values).text(**kwargs) == text


def test_every_algo_has_its_own_colour_family():
    """One colour per algo everywhere (its config's report.colormap): the privacy recipe draws
    any algos side by side."""
    from pathlib import Path

    import yaml

    folder = Path(__file__).parents[1] / "conf" / "algo"
    colormaps = {}
    for path in folder.glob("*.yaml"):
        colormaps[path.stem] = (yaml.safe_load(path.read_text()).get("report") or {}).get(
            "colormap"
        )
    assert all(colormaps.values()), colormaps
    assert len(set(colormaps.values())) == len(colormaps)


def test_pbm_cost_to_target_in_the_papers_units():
    from vfl_lightning.report.recipe_pbm import paper_units_table

    def run(seed, reached):
        results = {
            "algo": "pbm",
            "seed": seed,
            "comm/rounds": 1000,
            "comm/paper_cost_bits": 4.0e9,
            "privacy/feature_eps": 2.0,  # a noisy run: its accountant's ε (b and β are shown)
            "rounds_to_target": 250 if reached else None,
            "epoch_to_target": 5 if reached else None,
            "mb_to_target": 60.0 if reached else None,
        }
        config = {"mechanism": {"b": 16, "beta": 0.15}}
        return Run(Path(f"/runs/{seed}"), results, [], config=config)

    text = paper_units_table([Group("pbm", {}, [run(0, True), run(1, True), run(2, False)])])
    # ledger: 60 MB (10^6 bytes) = 480 x 10^6 bits; formula: 4e9 bits x 250/1000 rounds = 1000
    # epoch_to_target is 0-based: the target was reached in the 6th epoch
    assert (
        "| pbm | 16 | 0.15 | – | 3 | 6.0 ± 0.0 (2/3) | 480.0 ± 0.0 (2/3) | 1000.0 ± 0.0 (2/3) |"
        in text
    )


def test_fedvs_accuracy_at_rounds_and_at_times():
    from vfl_lightning.report.recipe_fedvs import accuracy_at

    curve = [
        {"comm/rounds": 10.0, "time/simulated_s": 5.0, "val/acc": 0.2},
        {"comm/rounds": 20.0, "time/simulated_s": 12.0, "val/acc": 0.5},
    ]
    group = Group("fedvs", {}, [Run(Path("/runs/0"), {"algo": "fedvs"}, curve)])
    at_rounds = accuracy_at(group, "comm/rounds", [5, 10, 19, 20])
    assert at_rounds.shape == (4, 1)
    assert np.isnan(at_rounds[0, 0]) and list(at_rounds[1:, 0]) == [0.2, 0.2, 0.5]
    assert list(accuracy_at(group, "time/simulated_s", [11.9, 12])[:, 0]) == [0.2, 0.5]


def test_fedvs_figures_of_groups_with_different_fixed_keys_get_their_own_files():
    from vfl_lightning.report.document import Context
    from vfl_lightning.report.recipe_fedvs import fedvs

    curve = [{"comm/rounds": 10.0, "time/simulated_s": 5.0, "val/acc": 0.2}]
    results = {"algo": "fedvs", "fedvs/K": 1, "fedvs/T": 1, "fedvs/R": 3, "comm/rounds": 10}
    results["time/simulated_s"] = 5.0
    groups = [
        Group(label, values, [Run(Path(f"/runs/{label}"), dict(results), curve)])
        for label, values in (("a", {"a": "1", "b": None}), ("b", {"a": None, "b": "2"}))
    ]
    runs = [g.runs[0] for g in groups]
    section = fedvs(Context(runs, groups, "time/simulated_s", "val/acc", "t", [5.0]))
    stems = [stem for stem, _, _ in section.figures]
    assert stems == ["fedvs_acc_vs_time", "fedvs_acc_vs_time_2"]
    for _, figure, _ in section.figures:
        plt.close(figure)
