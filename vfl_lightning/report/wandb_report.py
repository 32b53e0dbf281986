"""The report as a W&B Report (wandb-workspaces, reports v2): built offline as a specification
(JSON, no network call), and saved to W&B only when credentials are present."""

from __future__ import annotations

import json
import netrc
import os
import shlex
import threading
from collections.abc import Sequence
from pathlib import Path

from vfl_lightning.report.document import Panel, Section
from vfl_lightning.report.runs import ReportError, Run

OFFLINE_MODES = ("offline", "disabled", "dryrun")


def parse_target(target: str) -> tuple[str, str]:
    """``ENTITY/PROJECT`` -> (entity, project)."""
    entity, _, project = target.partition("/")
    if not entity or not project or "/" in project:
        raise ReportError(f"--wandb must be ENTITY/PROJECT (e.g. me/vfl), got {target!r}")
    return entity, project


def logged_groups(runs: Sequence[Run], entity: str, project: str) -> list[str]:
    """The W&B groups of ``runs``, after checking that every run was logged to W&B and to the
    project (and entity, when the run knew it) of ``--wandb``: a report whose runsets name
    another project shows nothing after `wandb sync`."""
    target = f"{entity}/{project}"
    missing = [run for run in runs if not run.wandb]
    if missing:
        raise ReportError(
            f"--wandb {target}: {len(missing)} of {len(runs)} runs were not logged to W&B (e.g. "
            f"{missing[0].path}, run with logger=csv or none); make the report without --wandb, "
            "or re-run them with the default logger (logger=wandb)"
        )
    projects = sorted({str(run.wandb.get("project")) for run in runs})
    if len(projects) > 1:
        raise ReportError(
            f"--wandb {target}: the runs were logged to several W&B projects ({', '.join(projects)}); "
            "make one report per project"
        )
    entities = sorted({run.wandb.get("entity") for run in runs} - {None, ""})
    known = entities[0] if len(entities) == 1 else None
    if projects[0] != project or (known and known != entity):
        logged = f"{known}/{projects[0]}" if known else projects[0]
        raise ReportError(
            f"--wandb {target}: the runs were logged to W&B project {logged} "
            f"(logger.wandb.project); use --wandb {known or entity}/{projects[0]}"
        )
    return sorted({str(run.wandb_group) for run in runs})


def sync_command(runs: Sequence[Run], entity: str, project: str) -> str:
    """`wandb sync -e ENTITY -p PROJECT <offline run dirs>` for the offline runs among ``runs``
    (empty when every run was logged online)."""
    offline = [run for run in runs if (run.wandb or {}).get("mode") == "offline"]
    patterns = sorted(
        {
            f"{shlex.quote(str(run.sweep))}/*/wandb/offline-run-*"
            if run.sweep is not None
            else f"{shlex.quote(str(run.path))}/wandb/offline-run-*"
            for run in offline
        }
    )
    if not patterns:
        return ""
    return f"wandb sync -e {shlex.quote(entity)} -p {shlex.quote(project)} " + " ".join(patterns)


def group_filter(group: str) -> str:
    """The runset filter expression selecting one W&B run group."""
    return f"Metric('group') == {json.dumps(group)}"


def build_report(
    *,
    entity: str,
    project: str,
    title: str,
    description: str,
    commands: Sequence[str],
    sections: Sequence[Section],
    groups: Sequence[str],
    group_by: Sequence[str],
    runset_project: bool,
    x: str = "epoch",
    y: str = "val/acc",
):
    """The wandb-workspaces Report: title, description, the sweep commands, and per section a
    panel grid (one runset per W&B run group, line plots over the section's axes and ``y`` over
    the chosen ``x``, runs grouped by the varying config keys with mean and std) followed by the
    section's tables.

    ``runset_project=False`` leaves the runsets' entity/project empty: wandb-workspaces looks a
    named project up over the network when it serializes a runset, so the offline
    specification names the project in JSON afterwards (see :func:`offline_spec`).
    """
    import wandb_workspaces.reports.v2 as wr

    owner = (entity, project) if runset_project else ("", "")
    grouping = [f"config.{key}" for key in group_by]

    def runsets():
        return [
            wr.Runset(
                entity=owner[0],
                project=owner[1],
                name=f"group {group}",
                filters=group_filter(group),
                groupby=grouping,
            )
            for group in groups
        ]

    code = "\n".join(commands)
    blocks = [
        wr.H1(title),
        wr.P(description),
        wr.MarkdownBlock(text=f"Sweeps:\n\n```bash\n{code}\n```"),
    ]
    for section in sections:
        blocks.append(wr.H2(section.title))
        if section.text:
            blocks.append(wr.P(section.text))
        chosen = [p for p in section.panels if p.kind == "line" and p.x == x]
        extra = [] if chosen or not section.panels else [Panel("line", f"{y} over {x}", [y], x)]
        panels = []
        for panel in [*section.panels, *extra]:
            if panel.kind == "line":
                panels.append(
                    wr.LinePlot(
                        title=panel.title,
                        x=panel.x,
                        y=list(panel.y),
                        groupby_aggfunc="mean",
                        groupby_rangefunc="stddev",
                    )
                )
            else:
                panels.append(
                    wr.BarPlot(
                        title=panel.title,
                        metrics=list(panel.y),
                        groupby_aggfunc="mean",
                        groupby_rangefunc="stddev",
                    )
                )
        if panels:
            blocks.append(wr.PanelGrid(runsets=runsets(), panels=panels))
        blocks += [wr.MarkdownBlock(text=text) for text in section.tables if text]
    return wr.Report(
        entity=entity, project=project, title=title, description=description, blocks=blocks
    )


def offline_spec(report, entity: str, project: str) -> dict:
    """The report's full specification as W&B stores it, with every runset naming its project;
    no network call (the runsets were built without a project, see :func:`build_report`)."""
    model = report._to_model()
    spec = json.loads(model.model_dump_json(by_alias=True, exclude_none=True))
    for block in spec["spec"]["blocks"]:
        if block.get("type") == "panel-grid":
            for runset in block["metadata"]["runSets"]:
                runset["project"] = {"name": project, "entityName": entity}
    return spec


def has_credentials() -> bool:
    """Whether W&B could be reached with a key: not offline, and an API key in the environment
    or in ~/.netrc. Nothing is contacted."""
    if os.environ.get("WANDB_MODE", "").lower() in OFFLINE_MODES:
        return False
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        auth = netrc.netrc().authenticators(
            os.environ.get("WANDB_BASE_URL", "api.wandb.ai").split("//")[-1]
        )
    except (FileNotFoundError, netrc.NetrcParseError):
        return False
    return auth is not None


def save_online(report, timeout_s: float) -> str | None:
    """Save the report to W&B in a worker thread; its URL, or ``None`` after ``timeout_s`` or on
    any error (the caller keeps the offline specification either way)."""
    outcome: dict[str, object] = {}

    def work() -> None:
        try:
            outcome["url"] = report.save().url
        except Exception as error:  # noqa: BLE001 - any failure falls back to the spec file
            outcome["error"] = error

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    worker.join(timeout_s)
    if "url" in outcome:
        return str(outcome["url"])
    reason = outcome.get("error", f"no answer within {timeout_s:g} s")
    print(f"W&B report not saved: {reason}")
    return None


def read_spec(spec_path: Path):
    """The W&B Report a specification file written by the report command describes; a
    ReportError naming the file when it cannot be read, is not JSON or not such a specification."""
    import pydantic
    import wandb_workspaces.reports.v2 as wr
    from wandb_workspaces.reports.v2 import internal

    fix = "give the wandb_report.json the report command wrote with --wandb"
    try:
        spec = json.loads(Path(spec_path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ReportError(f"{spec_path} cannot be read as JSON ({error}): {fix}") from None
    try:
        return wr.Report._from_model(internal.ReportViewspec.model_validate(spec))
    except (pydantic.ValidationError, TypeError, KeyError, AttributeError) as error:
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ReportError(
            f"{spec_path} is not a W&B Report specification ({first}): {fix}"
        ) from None


def publish(report, timeout_s: float = 120.0) -> str | None:
    """Save a report read by :func:`read_spec` to W&B (needs network and a key)."""
    return save_online(report, timeout_s)
