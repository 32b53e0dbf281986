"""The PBM-VFL recipe: accuracy against feature ε (deployed and noise-free), accuracy per epoch,
MB to target, and the exact per-release privacy of the (b, β) present."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from vfl_lightning.report import charts, figures
from vfl_lightning.report.aggregate import summarize
from vfl_lightning.report.document import Context, Panel, Section, ordered
from vfl_lightning.report.markdown import final_prefix, has, number, table
from vfl_lightning.report.runs import Group


def setting_label(group: Group) -> str:
    """``b=16, β=0.15``: the mechanism setting of a PBM or LDP group."""
    b, beta = group.runs[0].setting("mechanism.b"), group.runs[0].setting("mechanism.beta")
    return f"b={b}, β={beta}"


def pbm(ctx: Context) -> Section:
    """Accuracy against feature ε per mechanism and (b, β), noisy and clean; accuracy per epoch;
    MB to target; the exact per-release privacy of the (b, β) present."""
    section = Section(
        "PBM-VFL: accuracy, privacy, communication",
        "Deployed accuracy evaluates through the mechanism (filled markers, solid lines); "
        "noise-free accuracy evaluates the plain sum of the clean embeddings, as the PBM authors' "
        "code does (open markers, dashed lines). Feature ε at δ = 1e-5 after the whole run.",
    )
    prefix = final_prefix(ctx.runs)
    groups = ordered(ctx.groups, "pbm")
    private = [g for g in groups if g.noisy]
    baselines = [g for g in groups if not g.noisy]
    noisy_algos = list(dict.fromkeys(g.algo for g in private))
    series = {}
    for algo in noisy_algos:
        entries = []
        for group in (g for g in private if g.algo == algo):
            entries.append((group, "privacy/feature_eps", f"{prefix}/acc", "filled"))
            entries.append((group, "privacy/feature_eps", f"{prefix}/acc_clean", "open"))
        if entries:
            series[algo] = entries
    lines = [
        (f"{g.label} (no privacy)", summarize(g.values_of(f"{prefix}/acc")).mean) for g in baselines
    ]
    section.add_figure(
        "pbm_acc_vs_eps",
        charts.points(
            series,
            f"{ctx.title}: {prefix} accuracy against feature privacy",
            figures.label("privacy/feature_eps") + ", log scale",
            f"{prefix} accuracy (filled: deployed, open: noise-free)",
            log_x=True,
            lines=lines,
            marker_by=setting_label,
        ),
        f"{prefix} accuracy against feature ε per mechanism (colour) and (b, β) (marker)",
    )
    for algo in noisy_algos:
        chosen = [g for g in private if g.algo == algo]
        if chosen:
            section.add_figure(
                f"{algo}_acc_vs_epoch",
                figures.curves(
                    [*chosen, *baselines],
                    "epoch",
                    ["val/acc", "val/acc_clean"],
                    f"{ctx.title}: {algo} validation accuracy",
                ),
                f"{algo}: validation accuracy per epoch (solid: deployed, dashed: noise-free)",
            )
    if has(ctx.runs, "mb_to_target"):
        target = ctx.runs[0].results.get("target_metric"), ctx.runs[0].results.get("target_value")
        epochs = max(int(r.value("epochs")) for r in ctx.runs if r.value("epochs") > 0)
        section.add_figure(
            "pbm_mb_to_target",
            charts.bars(
                [g.label for g in groups],
                {"MB to target": [summarize(g.values_of("mb_to_target")) for g in groups]},
                f"{ctx.title}: communication until {target[0]} ≥ {target[1]}",
                "MB (uplink + downlink + peer) to target",
                missing_text=f"not reached in {epochs} epochs",
            ),
            f"MB until {target[0]} first reached {target[1]} (k/n: only k of n seeds reached it)",
        )
    rows = []
    for group in groups:
        noisy = group.noisy
        rows.append(
            [
                *setting_columns(group),
                summarize(group.values_of(f"{prefix}/acc")).text(),
                summarize(group.values_of(f"{prefix}/acc_clean")).text() if noisy else "–",
                summarize(group.values_of("train/acc")).text(),
                summarize(group.values_of("privacy/feature_eps")).text(1) if noisy else "∞",
                summarize(group.values_of("mb_to_target")).text(3),
                summarize(group.values_of("comm/uplink_mb")).text(3),
                summarize(group.values_of("comm/total_mb")).text(3),
            ]
        )
    section.tables.append(
        table(
            [
                *SETTING_HEADER,
                f"{prefix} acc",
                f"{prefix} acc (noise-free)",
                "train acc",
                "feature ε",
                "MB to target",
                "uplink MB",
                "total MB",
            ],
            rows,
        )
    )
    if has(ctx.runs, "mb_to_target") and has(ctx.runs, "comm/paper_cost_bits"):
        section.tables.append(paper_units_table(groups))
    section.tables.append(privacy_table(private))
    section.panels += [
        Panel("line", "validation accuracy per epoch", ["val/acc", "val/acc_clean"], "epoch"),
        Panel("line", "validation accuracy against feature ε", ["val/acc"], "privacy/feature_eps"),
        Panel("bar", "MB to target", ["mb_to_target"]),
    ]
    return section


def paper_cost_to_target(run) -> float:
    """The paper's formula T·B·M·P·(log(bM) + F) up to the target round, in 10^6 bits: the run's
    ``comm/paper_cost_bits`` times the share of its rounds spent before the target."""
    return (
        run.value("comm/paper_cost_bits")
        * run.value("rounds_to_target")
        / run.value("comm/rounds")
        / 1e6
    )


SETTING_HEADER = ["algo", "b", "β", "epochs", "seeds"]
"""The first columns of every PBM table (:func:`setting_columns`)."""


def setting_columns(group: Group) -> list:
    """The algo, b and β (for a noisy group), the epochs its runs trained and the number of
    seeds: a PBM table's first columns (groups that differ only by their length stay apart)."""
    run = group.runs[0]
    noisy = group.noisy
    epochs = sorted({int(e) for e in group.values_of("epochs") if np.isfinite(e)})
    return [
        group.algo,
        run.setting("mechanism.b", "-") if noisy else "-",
        run.setting("mechanism.beta", "-") if noisy else "-",
        ",".join(map(str, epochs)) or "–",
        len(group.runs),
    ]


def paper_units_table(groups: Sequence[Group]) -> str:
    """PBM-VFL Table 1's format: epochs to target and the communication to reach it in the
    paper's units (its "MB" are 10^6 bits), by this library's ledger (⌈log2(Mb+1)⌉ bits per PBM
    element) and by the paper's formula (natural log, F = 32). Epochs count the one in which the
    target was reached (``epoch_to_target`` is its 0-based index)."""
    rows = []
    for group in groups:
        rows.append(
            [
                *setting_columns(group),
                summarize([e + 1 for e in group.values_of("epoch_to_target")]).text(1),
                summarize([8 * v for v in group.values_of("mb_to_target")]).text(1),
                summarize([paper_cost_to_target(r) for r in group.runs]).text(1),
            ]
        )
    return (
        "Communication to the target in the paper's units (10^6 bits, Table 1's \"MB\"): by "
        "this library's ledger, and by the paper's formula T·B·M·P·(log(bM) + F) (natural log, "
        "F = 32) over the same rounds; k/n: only k of n seeds reached the target.\n\n"
        + table(
            [
                *SETTING_HEADER,
                "epochs to target",
                "ledger (10^6 bits)",
                "paper formula (10^6 bits)",
            ],
            rows,
        )
    )


def privacy_table(groups: Sequence[Group]) -> str:
    """Exact per-release PBM RDP (one coordinate) for the (b, β, M) present, next to the paper's
    asymptotic forms: implied C0 = ε_feat / (bβ²α/M), and the sample/feature ratio against the
    paper's S_M(α)/α."""
    from vfl_lightning.privacy.analysis import pbm_rdp, sample_privacy_factor

    settings = sorted(
        {
            (
                int(g.runs[0].setting("mechanism.b")),
                float(g.runs[0].setting("mechanism.beta")),
                int(g.runs[0].results["num_parties"]),
            )
            for g in groups
            if g.runs[0].setting("mechanism.b") is not None
            and g.runs[0].setting("mechanism.beta") is not None
        }
    )
    if not settings:
        return ""
    orders = np.array([2.0, 8.0, 32.0])
    rows = []
    for b, beta, m in settings:
        feature = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=m)
        sample = pbm_rdp(orders=orders, b=b, beta=beta, num_parties=m, num_changed=m)
        factor = sample_privacy_factor(orders, m) / orders if m >= 2 else np.full(3, np.nan)
        implied = feature / (b * beta**2 * orders / m)
        for i, alpha in enumerate(orders):
            rows.append(
                [
                    b,
                    beta,
                    m,
                    f"{alpha:g}",
                    number(feature[i]),
                    number(implied[i], 3),
                    number(sample[i]),
                    number(sample[i] / feature[i], 3),
                    number(factor[i], 3),
                ]
            )
    return (
        "Exact PBM Rényi DP of one release (one coordinate) for the (b, β, M) above, beside the "
        "paper's forms (implied C0 = exact ε_feat / (bβ²α/M)):\n\n"
        + table(
            [
                "b",
                "β",
                "M",
                "α",
                "exact ε_feat",
                "implied C0",
                "exact ε_sample",
                "ε_sample / ε_feat",
                "paper S_M(α)/α",
            ],
            rows,
        )
    )
