"""The cascaded hybrid optimization recipe: accuracy per epoch and per MB per algo, and the
label-inference accuracy of a curious client and an eavesdropper."""

from __future__ import annotations

import math

from vfl_lightning.report import charts, figures
from vfl_lightning.report.aggregate import Summary, summarize
from vfl_lightning.report.document import Context, Panel, Section, ordered
from vfl_lightning.report.markdown import final_prefix, has, table
from vfl_lightning.report.runs import relabel

ATTACKS = {
    "attack/label_inference/acc": "curious client",
    "attack/label_inference/eavesdropper_acc": "eavesdropper",
}


def cascade(ctx: Context) -> Section:
    """Accuracy per epoch and per MB per algo; label-inference accuracy (curious client,
    eavesdropper) when the attack ran."""
    section = Section(
        "Cascaded hybrid optimization: accuracy, communication, label inference",
        "Validation accuracy over epochs and over communicated MB; the table gives the final "
        "test accuracy (%).",
    )
    ranked = ordered(ctx.groups, "cascade")
    attacked = relabel([g for g in ranked if has(g.runs, "attack/label_inference/acc")])
    groups = relabel([g for g in ranked if not has(g.runs, "attack/label_inference/acc")])
    prefix = final_prefix(ctx.runs)
    section.add_figure(
        "cascade_acc_vs_epoch",
        figures.curves(groups, "epoch", ["val/acc"], f"{ctx.title}: validation accuracy"),
        "validation accuracy per epoch",
    )
    section.plotted.append(("epoch", "val/acc"))
    section.add_figure(
        "cascade_acc_vs_mb",
        figures.curves(
            groups,
            "comm/total_mb",
            ["val/acc"],
            f"{ctx.title}: accuracy against communication",
            log_x=True,
        ),
        "validation accuracy against communicated MB",
    )
    rows = []
    for group in groups:
        hidden = group.runs[0].setting("head.hidden")
        epochs = sorted(
            {int(r.value("epochs")) for r in group.runs if math.isfinite(r.value("epochs"))}
        )
        rows.append(
            [
                group.label,
                int(group.runs[0].value("num_parties")),
                "-" if not hidden else "/".join(map(str, hidden)),
                len(group.runs),
                ",".join(map(str, epochs)),
                summarize(group.values_of(f"{prefix}/acc")).text(1, scale=100),
                summarize(group.values_of("comm/uplink_mb")).text(2),
                summarize(group.values_of("comm/downlink_mb")).text(4),
                summarize(group.values_of("comm/rounds")).text(0),
            ]
        )
    section.tables.append(
        ""
        if not rows
        else table(
            [
                "group",
                "clients",
                "server hidden",
                "seeds",
                "epochs",
                f"{prefix} acc (%)",
                "uplink MB",
                "downlink MB",
                "rounds",
            ],
            rows,
        )
    )
    if attacked:
        scaled = {
            name: [scale(summarize(g.values_of(key)), 100) for g in attacked]
            for key, name in ATTACKS.items()
        }
        classes = {g.runs[0].setting("party.embedding_dim") for g in attacked}
        chance = None
        if len(classes) == 1 and isinstance(next(iter(classes)), int):
            count = classes.pop()  # the attack needs party outputs of num_classes entries
            chance = (100 / count, f"chance (1/{count} classes)")
        section.add_figure(
            "cascade_label_inference",
            charts.bars(
                [g.label for g in attacked],
                scaled,
                f"{ctx.title}: label inference by client 0",
                "labels inferred (%)",
                missing_text="n/a",
                reference=chance,
            ),
            "label-inference accuracy of a curious client and of an eavesdropper "
            "(dotted: guessing at chance)",
        )
        section.tables.append(
            table(
                ["group", "clients", "seeds", "curious client (%)", "eavesdropper (%)"],
                [
                    [
                        g.label,
                        int(g.runs[0].value("num_parties")),
                        len(g.runs),
                        *(summarize(g.values_of(k)).text(1, scale=100) for k in ATTACKS),
                    ]
                    for g in attacked
                ],
            )
        )
        section.panels.append(Panel("bar", "label inference", list(ATTACKS)))
    section.panels += [
        Panel("line", "validation accuracy per epoch", ["val/acc"], "epoch"),
        Panel("line", "validation accuracy against MB", ["val/acc"], "comm/total_mb"),
    ]
    return section


def scale(summary: Summary, factor: float) -> Summary:
    return Summary(summary.mean * factor, summary.std * factor, summary.count, summary.total)
