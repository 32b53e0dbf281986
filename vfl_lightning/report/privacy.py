"""The ``privacy`` report recipe: every attack's headline metric (the one it declares in
results.json, ``attack/<name>/headline``) against main-task accuracy (the privacy-utility
frontier) per protocol and defense, reconstruction error against formal feature ε for PBM and
LDP, and one table per attack with VFLAIR's defense capability score."""

from __future__ import annotations

import math
from collections.abc import Sequence

from vfl_lightning.privacy.analysis.dcs import DCS_BETA, defense_capability_score
from vfl_lightning.report import charts, figures
from vfl_lightning.report.aggregate import summarize
from vfl_lightning.report.document import Context, Panel, Section
from vfl_lightning.report.markdown import table
from vfl_lightning.report.runs import SYMBOLS, Group, ReportError

NOT_SETTINGS = ("attack", "defense", "trainer.", "callbacks.", "logger")
"""Override keys that do not name a protocol setting (shown elsewhere, or plumbing)."""


def attack_names(groups: Sequence[Group]) -> list[str]:
    """The attacks some run reports (``attack/<name>/performance``), by name."""
    return sorted(
        {
            key.split("/")[1]
            for group in groups
            for run in group.runs
            for key in run.results
            if key.startswith("attack/") and key.endswith("/performance")
        }
    )


def headline(groups: Sequence[Group], name: str) -> tuple[str, str]:
    """(metric, axis label) that attack ``name`` declared as its headline in its runs'
    results.json (``attack/<name>/headline``); ``performance`` for runs that declared none."""
    for group in groups:
        for run in group.runs:
            declared = run.results.get(f"attack/{name}/headline")
            if isinstance(declared, dict) and declared.get("metric"):
                metric = str(declared["metric"])
                return metric, str(declared.get("label") or f"{name} {metric}")
    return "performance", f"{name} performance"


def main_metric(group: Group) -> str:
    """``test/acc`` when the group's runs tested, else ``val/acc``."""
    return "test/acc" if summarize(group.values_of("test/acc")).count else "val/acc"


def setting_of(group: Group) -> str:
    """The algo and the protocol settings that tell its groups apart (``pbm β=0.05 b=4``)."""
    shown = [
        f"{SYMBOLS.get(key.rsplit('.', 1)[-1], key.rsplit('.', 1)[-1])}={value}"
        for key, value in group.values.items()
        if value is not None and not key.startswith(NOT_SETTINGS)
    ]
    return " ".join([group.algo, *shown])


def defense_of(group: Group) -> str:
    """The group's defense and strengths (``label_dp epsilon=0.1``), or ``none``."""
    name = group.runs[0].results.get("defense/name")
    if not name:
        return "none"
    shown = [
        f"{k.split('.', 1)[1]}={v}"
        for k, v in group.values.items()
        if k.startswith("defense.") and v
    ]
    return " ".join([name, *shown])


def reference_group(group: Group, groups: Sequence[Group]) -> Group | None:
    """The same protocol without defense: same algo, same overrides except the defense's."""
    if defense_of(group) == "none":
        return group
    own = {k: v for k, v in group.values.items() if not k.startswith("defense")}
    for other in groups:
        if other.algo != group.algo or defense_of(other) != "none":
            continue
        if {k: v for k, v in other.values.items() if not k.startswith("defense")} == own:
            return other
    return None


def group_dcs(group: Group, reference: Group | None, name: str) -> float:
    """DCS of the group's mean attack performance and accuracy; MP* from ``reference``."""
    if reference is None:
        return math.nan
    metric = main_metric(group)
    performance = summarize(group.values_of(f"attack/{name}/performance")).mean
    baseline = summarize(group.values_of(f"attack/{name}/baseline")).mean
    accuracy = summarize(group.values_of(metric)).mean
    reference_accuracy = summarize(reference.values_of(metric)).mean
    values = (performance, baseline, accuracy, reference_accuracy)
    if not all(math.isfinite(v) for v in values):
        return math.nan
    return defense_capability_score(
        attack_performance=performance,
        attack_baseline=baseline,
        main_performance=accuracy,
        main_reference=reference_accuracy,
    )


def setting_and_defense(group: Group) -> str:
    """A frontier marker's shape: the group's label without its protocol (colour tells that)."""
    _, _, rest = group.label.partition(" ")
    return rest or "default setting"


def frontier(groups: Sequence[Group], name: str, title: str):
    """Attack metric against main-task accuracy: one series (color) per protocol, each point
    annotated with its protocol setting and defense."""
    key, ylabel = headline(groups, name)
    attacked = [g for g in groups if summarize(g.values_of(f"attack/{name}/{key}")).count]
    series: dict[str, list] = {}
    for group in attacked:
        series.setdefault(group.algo, []).append(
            (group, main_metric(group), f"attack/{name}/{key}", "filled")
        )
    if not series:
        return None
    xlabel = figures.label(main_metric(attacked[0]))
    return charts.points(series, f"{title}: {name}", xlabel, ylabel, marker_by=setting_and_defense)


def epsilon_figure(groups: Sequence[Group], title: str):
    """PBM / LDP: reconstruction relative MSE against the formal feature ε, with the
    labels-only baseline."""
    key = "attack/feature_reconstruction/rel_mse"
    noisy = [
        g
        for g in groups
        if g.noisy
        and summarize(g.values_of(key)).count
        and summarize(g.values_of("privacy/feature_eps")).count
    ]
    if not noisy:
        return None
    series: dict[str, list] = {}
    for group in noisy:
        series.setdefault(group.algo, []).append((group, "privacy/feature_eps", key, "filled"))
    baseline = summarize(
        [
            v
            for g in noisy
            for v in g.values_of("attack/feature_reconstruction/label_baseline_rel_mse")
        ]
    ).mean
    return charts.points(
        series,
        f"{title}: feature reconstruction against formal ε",
        figures.label("privacy/feature_eps"),
        headline(noisy, "feature_reconstruction")[1],
        log_x=True,
        lines=[("labels-only baseline", baseline)],
        connect=True,
    )


def attack_table(groups: Sequence[Group], name: str) -> str:
    key, _ = headline(groups, name)
    rows = []
    for group in groups:
        values = summarize(group.values_of(f"attack/{name}/{key}"))
        if not values.count:
            continue
        extra = []
        if name == "feature_reconstruction":
            baseline = summarize(group.values_of(f"attack/{name}/label_baseline_rel_mse"))
            extra = [baseline.text(3), summarize(group.values_of("privacy/feature_eps")).text(1)]
        if name == "model_completion":
            extra = [summarize(group.values_of(f"attack/{name}/raw_features_acc")).text(3)]
        dcs = group_dcs(group, reference_group(group, groups), name)
        rows.append(
            [
                setting_of(group),
                defense_of(group),
                len(group.runs),
                summarize(group.values_of(main_metric(group))).text(3),
                values.text(3),
                *extra,
                "–" if not math.isfinite(dcs) else f"{dcs:.3f}",
            ]
        )
    header = ["group", "defense", "seeds", "main acc", key]
    if name == "feature_reconstruction":
        header += ["labels-only rel_mse", "feature ε"]
    if name == "model_completion":
        header += ["raw-features acc"]
    return f"**{name}**\n\n" + table([*header, "DCS"], rows)


def relabelled(groups: Sequence[Group]) -> list[Group]:
    """The groups labelled by protocol setting and defense (``pbm β=0.05 b=4``,
    ``splitnn label_dp epsilon=0.5``): what the figures annotate."""
    out = []
    for group in groups:
        defense = defense_of(group)
        label = setting_of(group) + ("" if defense == "none" else f" {defense}")
        out.append(Group(label, group.values, group.runs))
    return out


def privacy(ctx: Context) -> Section:
    groups = relabelled(ctx.groups)
    names = attack_names(groups)
    if not names:
        raise ReportError(
            "--recipe privacy needs runs with an attack (train.py attack=feature_reconstruction, "
            "norm_scoring, direction_scoring, model_completion or label_inference)"
        )
    section = Section(
        "Attacks and defenses",
        "Each attack's performance against the main task's accuracy (mean ± std over seeds; "
        "one color per protocol, each point annotated with its setting and defense), the reconstruction error against the "
        "formal feature ε for PBM and LDP, and one table per attack. DCS is VFLAIR's defense "
        f"capability score (β = {DCS_BETA}) against the same protocol without defense; "
        "docs/attacks.md defines every metric.",
    )
    for name in names:
        section.add_figure(
            f"frontier_{name}",
            frontier(groups, name, ctx.title),
            f"{name}: attack performance against main-task accuracy",
        )
        section.tables.append(attack_table(groups, name))
        key = headline(groups, name)[0]
        section.panels.append(Panel("bar", f"{name} ({key})", [f"attack/{name}/{key}"]))
    section.add_figure(
        "reconstruction_vs_eps",
        epsilon_figure(groups, ctx.title),
        "feature reconstruction relative MSE against formal feature ε (PBM, LDP)",
    )
    return section
