"""The privacy-audit recipe: the accountant's ε against the audit's empirical lower bound, per
protocol and setting (PBM's (b, β), LDP, the defenses), one figure per audit (the frontier, with
every seed) and one table with the bound's share of the accountant's ε."""

from __future__ import annotations

import math
from collections.abc import Sequence

from matplotlib.lines import Line2D

from vfl_lightning.privacy.analysis.message_audit import pooled_bound
from vfl_lightning.report.aggregate import summarize
from vfl_lightning.report.charts import MARKERS
from vfl_lightning.report.document import Context, Panel, Section, ordered
from vfl_lightning.report.figures import algo_color, new_figure, plain_log_axis
from vfl_lightning.report.markdown import final_prefix, table
from vfl_lightning.report.runs import Group


def audits_of(groups: Sequence[Group]) -> list[str]:
    """The audits some run of ``groups`` reports (``audit/<name>/eps_lower``), by name."""
    reported = {key for group in groups for run in group.runs for key in run.results}
    return sorted(
        key.split("/")[1]
        for key in reported
        if key.startswith("audit/") and key.endswith("/eps_lower")
    )


def what(groups: Sequence[Group], name: str) -> str:
    """What audit ``name`` measures: the label of its declared headline, else its name."""
    for group in groups:
        for run in group.runs:
            declared = run.results.get(f"audit/{name}/headline")
            if isinstance(declared, dict) and declared.get("label"):
                return str(declared["label"])
    return name


def accountant_values(group: Group, name: str) -> list[float]:
    """The accountant's ε of ``group``'s runs (``inf`` for a release without noise)."""
    values = []
    for run in group.runs:
        value = run.results.get(f"audit/{name}/eps_accountant")
        value = math.inf if value == "inf" else run.value(f"audit/{name}/eps_accountant")
        # one setting's seeds share the accountant's ε up to float rounding
        values.append(value if value is None or math.isinf(value) else round(value, 9))
    return values


def ratios(group: Group, name: str) -> list[float]:
    """Each run's bound over its accountant's ε (finite accountant ε only)."""
    out = []
    for run, accountant in zip(group.runs, accountant_values(group, name), strict=True):
        bound = run.value(f"audit/{name}/eps_lower")
        if bound is not None and math.isfinite(accountant) and accountant > 0:
            out.append(bound / accountant)
    return out


def pooled(group: Group, name: str) -> dict | None:
    """The multi-run bound of ``group``'s runs (seeds) together: their message canaries' scores
    (``audit_<name>.npz`` beside results.json) pooled into one f-DP one-run bound; None unless
    at least two runs wrote them."""
    paths = [run.path / f"audit_{name}.npz" for run in group.runs]
    if len(paths) < 2 or not all(path.is_file() for path in paths):
        return None
    return pooled_bound(paths)


def setting(group: Group) -> str:
    """What distinguishes a group besides its algo: its overrides, or "default"."""
    shown = group.label.split(" ", 1)
    return shown[1] if len(shown) > 1 else "default"


def audit_figure(groups: Sequence[Group], name: str, title: str):
    """The bound (each seed a small dot, mean ± std over seeds) against the accountant's ε
    (linear axes for finite ε within one decade, else log scale), one colour per algo and one
    marker per setting; the diagonal (bound = accountant), half of it, and the largest bound
    the audit's canaries allow. Releases without noise (accountant ε = ∞) are drawn at the right
    edge."""
    fig, (ax,) = new_figure(title)
    every = [e for g in groups for e in accountant_values(g, name)]
    finite = [e for e in every if math.isfinite(e)]
    # linear axes for a frontier of finite ε within one decade, else log (∞ at the right edge)
    linear = bool(finite) and len(finite) == len(every) and max(finite) <= 10 * min(finite)
    right = max(finite, default=10.0) * (1.1 if linear else 3)
    shapes: dict[str, str] = {}
    handles: dict[str, Line2D] = {}
    caps = []
    for group in groups:
        bound = summarize(group.values_of(f"audit/{name}/eps_lower"))
        if bound.count == 0:
            continue
        caps += group.values_of(f"audit/{name}/eps_lower_max")
        eps = accountant_values(group, name)
        x = right if all(math.isinf(e) for e in eps) else summarize(eps).mean
        marker = shapes.setdefault(setting(group), MARKERS[len(shapes) % len(MARKERS)])
        color = algo_color(group)
        ax.errorbar(x, bound.mean, yerr=bound.std, fmt=marker, color=color, capsize=3)
        for run_eps, run_bound in zip(eps, group.values_of(f"audit/{name}/eps_lower"), strict=True):
            if math.isfinite(run_bound):
                ax.plot(
                    right if math.isinf(run_eps) else run_eps,
                    run_bound,
                    ".",
                    color=color,
                    markersize=3,
                    alpha=0.6,
                )
        handles.setdefault(
            group.algo, Line2D([], [], color=color, marker="o", linestyle="", label=group.algo)
        )
    if not handles:
        return None
    cap = summarize(caps)
    top = 1.15 * max(
        cap.mean if cap.count else 0.0,
        *(b for g in groups for b in g.values_of(f"audit/{name}/eps_lower") if math.isfinite(b)),
    )
    low = 0.0 if linear else min([*finite, 0.1]) / 2
    diagonal = (
        [0.0, right]
        if linear
        else [low * 1.1**k for k in range(int(math.log(right / low) / math.log(1.1)) + 2)]
    )
    ax.plot(diagonal, diagonal, color="black", linewidth=1)
    ax.plot(diagonal, [d / 2 for d in diagonal], color="black", linewidth=1, linestyle="--")
    if cap.count:
        ax.axhline(cap.mean, color="black", linestyle=":", linewidth=1)
    entries = [
        *handles.values(),
        Line2D([], [], color="black", linewidth=1, label="bound = accountant's ε"),
        Line2D([], [], color="black", linewidth=1, linestyle="--", label="half the accountant's ε"),
        Line2D(
            [],
            [],
            color="black",
            linestyle=":",
            label=f"largest bound {cap.mean:.2f} (every guess right)",
        ),
        *(Line2D([], [], color="gray", marker=m, linestyle="", label=s) for s, m in shapes.items()),
    ]
    if linear:
        ax.set_xlim(0.0, right)
        ax.set_xlabel("accountant's ε for the audited releases")
    else:
        plain_log_axis(ax, "x")
        ax.set_xlabel("accountant's ε for the audited releases (right edge: no noise, ε = ∞)")
    ax.set_ylim(-0.03 * max(top, 0.5), max(top, 0.5))
    ax.set_ylabel("empirical lower bound on ε (95 %; dots: seeds)")
    ax.legend(
        handles=entries, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False
    )
    fig.set_size_inches(8.6, 4.4)
    return fig


def pooled_cells(bound: dict | None) -> list[str]:
    """The table's pooled bound (with its number of runs) and its share of the accountant's ε."""
    if bound is None:
        return ["–", "–"]
    share = bound["eps_lower"] / bound["eps_accountant"] if bound["eps_accountant"] else math.nan
    return [f"{bound['eps_lower']:.2f} ({bound['runs']})", f"{share:.2f}"]


def audit(ctx: Context) -> Section:
    """Formal ε against empirical ε for every audit present, and one table of both."""
    section = Section(
        "Privacy audit: the accountant's ε against an empirical lower bound",
        "Each run audits (docs/audit.md): canaries whose audited value (a party's raw "
        "features, its clipped embedding for canary_message, the label for canary_label) takes "
        "one of two values by a fair coin; the auditor (the server, or a passive party for "
        "canary_label) guesses the coins from what it received. The bound holds at 95 % "
        "confidence and the accountant's δ: the one-run bound of Steinke, Nasr and Jagielski "
        "for input canaries, the f-DP one-run bound of Mahloujifar, Melis and Chaudhuri for "
        "canary_message and canary_label. The accountant's ε is for exactly the canaries' "
        "releases; the true ε of those releases lies between the two. No bound can exceed the "
        "audit's eps_lower_max, the bound if every guess were right. A pooled bound (message "
        "canaries) is the multi-run audit of the group's seeds: their canaries together in one "
        "f-DP bound (independent runs: each coin is in one run only).",
    )
    groups = ordered(ctx.groups, "pbm")
    prefix = final_prefix(ctx.runs)
    names = audits_of(groups)
    for name in names:
        section.add_figure(
            f"audit_{name}",
            audit_figure(groups, name, f"{ctx.title}: audit={name} ({what(groups, name)})"),
            f"audit={name}: the bound against the accountant's ε, per algo (colour) and setting "
            "(marker)",
        )
    header = ["algo", "setting", "seeds", f"{prefix} acc"]
    pools = {name: [pooled(group, name) for group in groups] for name in names}
    for name in names:
        if any(pools[name]):
            header += [f"{name}: pooled bound (runs)", f"{name}: pooled / accountant"]
        header += [
            f"{name}: accountant ε",
            f"{name}: bound",
            f"{name}: bound / accountant",
            f"{name}: guess acc",
            f"{name}: n",
        ]
    rows = []
    for index, group in enumerate(groups):
        row = [
            group.algo,
            setting(group),
            len(group.runs),
            summarize(group.values_of(f"{prefix}/acc")).text(3),
        ]
        for name in names:
            if any(pools[name]):
                row += pooled_cells(pools[name][index])
            eps = accountant_values(group, name)
            shown = (
                "∞"
                if eps and all(math.isinf(e) for e in eps)
                else summarize(eps).text(3, significant=True)
            )
            row += [
                shown,
                summarize(group.values_of(f"audit/{name}/eps_lower")).text(2),
                summarize(ratios(group, name)).text(2),
                summarize(group.values_of(f"audit/{name}/guess_acc")).text(3),
                summarize(group.values_of(f"audit/{name}/n")).text(0),
            ]
        rows.append(row)
    section.tables.append(table(header, rows))
    section.panels.append(
        Panel("bar", "audit: lower bound on ε", [f"audit/{name}/eps_lower" for name in names])
    )
    return section
