"""make_report: runs -> figures (PNG), a Markdown page and a W&B Report specification, written
into OUT only once everything is built (nothing half-written on an error)."""

from __future__ import annotations

import json
import math
import os
import platform
import re
import shlex
import shutil
import sys
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

from vfl_lightning.files import unwritable
from vfl_lightning.report import figures
from vfl_lightning.report.document import TITLES, Context, Section, ordered
from vfl_lightning.report.recipes import BUILDERS, check_recipe, choose_recipe, overview
from vfl_lightning.report.runs import (
    X_AXES,
    ReportError,
    group_runs,
    load_runs,
    sweep_commands,
    unfinished_runs,
    varying_keys,
)


def machine() -> str:
    """CPU model, core count, OS, Python and torch versions of this machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import torch

    return (
        f"{cpu}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def title_of(runs) -> str:
    data = runs[0].results.get("data")
    parties = sorted(
        {
            int(r.value("num_parties")) + bool(r.results.get("active_party"))
            for r in runs
            if r.results.get("num_parties")
        }
    )
    shown = str(parties[0]) if len(parties) == 1 else f"{parties[0]}–{parties[-1]}"
    return f"{data}, {shown} parties"


def wandb_group_by(runs) -> list[str]:
    """Config keys that tell the report's groups apart in W&B: the algo by its name, the varying
    overrides of single values (``mechanism.b``), and the varying choices of whole config groups
    (``experiment=``) by the ``choices`` the W&B logger puts in the run config."""
    keys = ["algo.name"] if len({run.algo for run in runs}) > 1 else []
    varying = [k for k in varying_keys(runs) if k != "algo"]
    return keys + [k if "." in k else f"choices.{k}" for k in varying]


def _file_names(name: str) -> tuple[str, str, str]:
    """(markdown file, figure prefix, W&B spec file) for a report called ``name``."""
    if name == "report":
        return "report.md", "", "wandb_report.json"
    return f"{name}.md", f"{name}_", f"{name}_wandb_report.json"


NAME = re.compile(r"\w[\w.-]*")
"""A report's ``--name``: the stem of its markdown file and its figures' prefix, in ``--out``."""


def check_arguments(out: Path, name: str, times, rounds) -> None:
    """``--out`` can be made and written, ``--name`` is a file name, ``--times`` and
    ``--rounds`` are finite numbers >= 0; else a ReportError naming the flag (nothing written)."""
    problem = unwritable(out)
    if problem:
        raise ReportError(f"--out {out} cannot be used: {problem}; give a directory you can write")
    if not NAME.fullmatch(name):
        raise ReportError(
            f"--name must be a file name of letters, digits, '_', '-' and '.' (it names "
            f"<name>.md and the figures in --out), got {name!r}"
        )
    for flag, values in (("--times", times), ("--rounds", rounds)):
        bad = [v for v in values or () if not math.isfinite(v) or v < 0]
        if bad:
            raise ReportError(f"{flag} must be finite numbers >= 0, got {bad[0]:g}")


def make_report(
    directories: Sequence[Path],
    out: Path,
    *,
    recipe: str = "auto",
    x: str = "epoch",
    y: str = "val/acc",
    wandb: str | None = None,
    name: str = "report",
    note: str = "",
    times: Sequence[float] | None = None,
    rounds: Sequence[float] | None = None,
    progress: bool = True,
    command: str | None = None,
    wandb_timeout_s: float = 60.0,
) -> list[Path]:
    """Build the report of the runs under ``directories`` into ``out``; return the files written.

    Raises :class:`ReportError` (nothing written) for: no runs, a run without curve.csv, runs of
    different datasets, an unknown recipe / axis / metric, a bad ``--wandb`` target.
    """
    from vfl_lightning.report.wandb_report import (
        build_report,
        has_credentials,
        logged_groups,
        offline_spec,
        parse_target,
        save_online,
        sync_command,
    )

    if x not in X_AXES:
        raise ReportError(f"--x must be one of {', '.join(X_AXES)}, got {x!r}")
    if recipe not in ("auto", "none", *BUILDERS):
        raise ReportError(
            f"--recipe must be auto, none or one of {', '.join(BUILDERS)}, got {recipe!r}"
        )
    target = parse_target(wandb) if wandb else None
    if Path(out).exists() and not Path(out).is_dir():
        raise ReportError(f"--out {out} is a file: give a directory (new or existing)")
    check_arguments(out, name, times, rounds)
    runs = load_runs(directories, progress=progress)
    if recipe not in ("auto", "none"):
        check_recipe(recipe, runs)
    wandb_groups = logged_groups(runs, *target) if target else []
    columns = {key for run in runs for row in run.curve for key in row}
    for axis, key in (("--x", X_AXES[x]), ("--y", y)):
        if key not in columns:
            raise ReportError(
                f"{axis} {key!r} is in no run's curve.csv; columns: {', '.join(sorted(columns))}"
            )
    chosen = choose_recipe(runs) if recipe == "auto" else (None if recipe == "none" else recipe)
    groups = ordered(group_runs(runs), chosen or "")
    title = title_of(runs)
    ctx = Context(runs, groups, X_AXES[x], y, title, times, rounds)
    sections: list[Section] = [] if chosen is None else [BUILDERS[chosen](ctx)]
    sections.append(overview(ctx, [p for section in sections for p in section.plotted]))
    commands = sweep_commands(runs)
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    written = sorted(
        datetime.fromtimestamp((r.path / "results.json").stat().st_mtime, timezone.utc)
        for r in runs
    )
    invocation = command or "python -m vfl_lightning.report " + shlex.join(
        "…" if previous == "--note" else arg
        for previous, arg in zip(["", *sys.argv[1:]], sys.argv[1:])
    )
    description = (
        f"{len(runs)} runs, finished {written[0]:%Y-%m-%d %H:%M} – {written[-1]:%Y-%m-%d %H:%M} "
        f"UTC on {machine()}; report generated {now} by the last command below."
    )

    def wandb_report(runset_project: bool):
        """The W&B Report of ``sections`` for ``target``; ``runset_project=False`` builds its
        runsets without a project, so nothing looks the project up over the network."""
        return build_report(
            entity=target[0],
            project=target[1],
            title=f"VFL report: {title}",
            description=description,
            commands=commands,
            sections=sections,
            groups=wandb_groups,
            group_by=wandb_group_by(runs),
            x=X_AXES[x],
            y=y,
            runset_project=runset_project,
        )

    markdown_name, prefix, spec_name = _file_names(name)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        heading = f"{TITLES[chosen]}: {title}" if chosen else title
        lines = [f"# {heading}", "", description, ""]
        if note:
            lines += [note, ""]
        lines += ["Commands:", "", "```bash", *commands, invocation, "```", ""]
        left_out = unfinished_runs(directories)
        if left_out:
            lines += ["Left out of every table and figure (did not finish):", ""]
            lines += [f"- {line}" for line in left_out] + [""]
        for section in sections:
            lines += [f"## {section.title}", ""]
            if section.text:
                lines += [section.text, ""]
            for stem, figure, caption in section.figures:
                file = f"{prefix}{stem}.png"
                figures.save(figure, staging / file)
                lines += [f"![{caption}]({file})", "", f"*{caption}.*", ""]
            for text in section.tables:
                if text:
                    lines += [text, ""]
        (staging / markdown_name).write_text("\n".join(lines))
        if target is not None:
            report = wandb_report(runset_project=False)
            spec = offline_spec(report, *target)
            (staging / spec_name).write_text(json.dumps(spec, indent=1))
        files = sorted(staging.iterdir())
        out.mkdir(parents=True, exist_ok=True)
        moved = []
        for file in files:
            os.replace(file, out / file.name)
            moved.append(out / file.name)
    finally:
        for section in sections:
            for _, figure, _ in section.figures:
                figures.plt.close(figure)
        shutil.rmtree(staging, ignore_errors=True)

    print(f"report: {out / markdown_name} ({len(moved) - 1} files)")
    if target is not None:
        spec_path = out / spec_name
        url = None
        if has_credentials():
            online = wandb_report(runset_project=True)
            url = save_online(online, wandb_timeout_s)
        if url:
            print(f"W&B report: {url}")
        else:
            sync = sync_command(runs, *target)
            upload = f"  {sync}\n" if sync else ""
            print(
                f"W&B report specification for {target[0]}/{target[1]}: {spec_path}\n"
                "to publish it later, with network and a W&B key (wandb login): upload the "
                f"offline runs, then the report:\n{upload}"
                f"  python -m vfl_lightning.report.publish {spec_path}"
            )
    return moved
