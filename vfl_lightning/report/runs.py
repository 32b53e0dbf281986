"""Finding and reading runs for a report: each run's results.json, curve.csv, Hydra overrides and
config, validated together (one dataset, every curve present) before anything is written."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vfl_lightning.curve import read_curve

# Override keys that never distinguish groups: the seed is aggregated, the rest are plumbing.
IGNORED_PREFIXES = ("seed", "hydra", "paths", "ckpt_path", "logger", "callbacks.checkpoint")
# The papers' recipes (vfl_lightning.report.recipes).
RECIPES = ("pbm", "fedbcd", "cascade", "fedvs", "privacy", "audit", "alignment")
# --x choices: curve.csv columns.
X_AXES = {
    "epoch": "epoch",
    "rounds": "comm/rounds",
    "simulated_s": "time/simulated_s",
    "mb": "comm/total_mb",
    "eps": "privacy/feature_eps",
}
# Written by the W&B logger into each run directory: id, entity, project, group, name, mode.
WANDB_RUN_FILE = "wandb_run.json"
# How a few override keys are shown in group labels.
SYMBOLS = {"beta": "β", "mu": "μ", "local_steps": "Q", "batch_size": "batch"}


class OneLineParser(argparse.ArgumentParser):
    """argparse with a usage error as one ``error: ...`` line (status 2), like the others."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (see --help)\n")


class ReportError(ValueError):
    """A report cannot be made from these inputs; the message says why and what to do."""


@dataclass
class Run:
    """One finished run: its directory, results.json, curve rows, overrides and config."""

    path: Path
    results: dict
    curve: list[dict[str, float]]
    overrides: dict[str, str] = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    sweep: Path | None = None
    wandb: dict | None = None

    def setting(self, dotted: str, default=None):
        """A value of the run's composed config (``.hydra/config.yaml``), e.g. ``mechanism.b``."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def algo(self) -> str:
        return str(self.results.get("algo"))

    def style(self, key: str, default=None):
        """How the report draws the run's algo, from the ``report`` node of its algo config
        (``recipes``, ``order``, ``baseline``, ``label``, ``colormap``); ``default`` without it."""
        value = self.setting(f"report.{key}")
        return default if value is None else value

    def in_recipe(self, recipe: str, *, baselines: bool = True) -> bool:
        """Whether the run's algo appears in ``recipe`` (``baselines=False``: as more than a
        shared baseline, whose presence alone does not choose a recipe)."""
        if not baselines and self.style("baseline", False):
            return False
        return recipe in (self.style("recipes") or [])

    @property
    def wandb_group(self) -> str | None:
        """The W&B group the run was logged under (``wandb_run.json``, written by the W&B
        logger); None for a run not logged to W&B."""
        return (self.wandb or {}).get("group")

    def value(self, key: str) -> float:
        """A numeric results.json value, else a numeric config value (``algo.local_steps``);
        NaN when absent or null."""
        value = self.results.get(key, self.setting(key))
        if isinstance(value, bool) or not isinstance(value, int | float):
            return math.nan
        return float(value)


def _read_overrides(run_dir: Path) -> dict[str, str]:
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return {}
    overrides = {}
    for item in yaml.safe_load(path.read_text()) or []:
        key, _, value = str(item).partition("=")
        key = key.lstrip("+~")
        if not key.startswith(IGNORED_PREFIXES):
            overrides[key] = canonical(value)
    return overrides


def canonical(value: str) -> str:
    """An override's value as a Hydra multirun writes it for its jobs (``false`` → ``False``,
    ``1e-3`` → ``0.001``), so that a single run typed one way and a sweep's job with the same
    setting fall into one group; any other text as given."""
    if value.lower() in ("true", "false"):
        return value.lower().capitalize()
    for kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            continue
        return str(number) if math.isfinite(number) else value
    return value


def _read_wandb(run_dir: Path) -> dict | None:
    """Where the run was logged to W&B (``wandb_run.json``), or None."""
    path = run_dir / WANDB_RUN_FILE
    return json.loads(path.read_text()) if path.is_file() else None


def _read_config(run_dir: Path) -> dict:
    path = run_dir / ".hydra" / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.is_file() else {}


def _is_multirun_job(run_dir: Path) -> bool:
    """Whether Hydra ran this job in a multirun (a grid, or an Optuna study)."""
    if (run_dir.parent / "multirun.yaml").is_file():
        return True
    hydra_file = run_dir / ".hydra" / "hydra.yaml"
    if not hydra_file.is_file():
        return False
    return (yaml.safe_load(hydra_file.read_text()) or {}).get("hydra", {}).get("mode") == "MULTIRUN"


def _status(results_path: Path) -> str | None:
    """The run's ``status`` in results.json (None for runs written before it existed)."""
    return json.loads(results_path.read_text()).get("status")


def find_results(directories: Sequence[Path]) -> list[Path]:
    """Every results.json under the given directories (a directory may itself be a run)."""
    missing = [str(d) for d in directories if not Path(d).is_dir()]
    if missing:
        raise ReportError(f"not a directory: {', '.join(missing)}")
    found = sorted({p for d in directories for p in Path(d).rglob("results.json")})
    if not found:
        raise ReportError(
            f"no runs under {', '.join(str(d) for d in directories)}: no results.json found "
            "(give run or sweep directories written by train.py)"
        )
    return found


def unfinished_runs(directories: Sequence[Path]) -> list[str]:
    """One line per run under ``directories`` that failed or was interrupted: its job's
    overrides, its status and its error."""
    lines = []
    for path in find_results([Path(d) for d in directories]):
        results = json.loads(path.read_text())
        if results.get("status") in (None, "finished"):
            continue
        overrides = " ".join(f"{k}={v}" for k, v in _read_overrides(path.parent).items())
        error = results.get("error")
        lines.append(
            f"`{overrides or path.parent}` ({results['status']})" + (f": {error}" if error else "")
        )
    return lines


def load_runs(directories: Sequence[Path], progress: bool = True) -> list[Run]:
    """Read every finished run under ``directories``; refuse runs without curve.csv and mixed
    datasets. Runs whose results.json says ``status`` failed or interrupted are left out (and
    listed on stderr): their final values are not comparable."""
    from tqdm.auto import tqdm

    paths = find_results([Path(d) for d in directories])
    unfinished = [p for p in paths if _status(p) not in (None, "finished")]
    if unfinished:
        paths = [p for p in paths if p not in unfinished]
        if not paths:
            raise ReportError(
                f"no finished runs under {', '.join(str(d) for d in directories)}: all "
                f"{len(unfinished)} runs failed or were interrupted"
            )
        print(
            f"leaving out {len(unfinished)} run(s) that did not finish: "
            + ", ".join(f"{p.parent} ({_status(p)})" for p in unfinished[:5])
            + (" ..." if len(unfinished) > 5 else ""),
            file=sys.stderr,
        )
    without_curve = [str(p.parent) for p in paths if not (p.parent / "curve.csv").is_file()]
    if without_curve:
        shown = ", ".join(without_curve[:3]) + (" ..." if len(without_curve) > 3 else "")
        raise ReportError(
            f"{len(without_curve)} run(s) have results.json but no curve.csv (written by older "
            f"versions): {shown}; re-run them or leave their directories out"
        )
    runs = []
    for path in tqdm(paths, desc="reading runs", unit="run", disable=not progress):
        run_dir = path.parent
        sweep = run_dir.parent if _is_multirun_job(run_dir) else None
        runs.append(
            Run(
                path=run_dir,
                results=json.loads(path.read_text()),
                curve=read_curve(run_dir / "curve.csv"),
                overrides=_read_overrides(run_dir),
                config=_read_config(run_dir),
                sweep=sweep,
                wandb=_read_wandb(run_dir),
            )
        )
    datasets: dict[str, list[Run]] = {}
    for run in runs:
        datasets.setdefault(str(run.results.get("data")), []).append(run)
    if len(datasets) > 1:
        parts = [f"{name} ({len(rs)} runs, e.g. {rs[0].path})" for name, rs in datasets.items()]
        raise ReportError(f"runs mix datasets: {'; '.join(parts)}; make one report per dataset")
    return runs


def varying_keys(runs: Iterable[Run]) -> list[str]:
    """Override keys whose value differs between runs (the seed and plumbing excluded)."""
    runs = list(runs)
    keys = sorted({k for run in runs for k in run.overrides})
    return [k for k in keys if len({run.overrides.get(k) for run in runs}) > 1]


@dataclass
class Group:
    """Runs that differ only by seed: a label, the distinguishing values, the runs."""

    label: str
    values: dict[str, str | None]
    runs: list[Run]

    @property
    def algo(self) -> str:
        return self.runs[0].algo

    def style(self, key: str, default=None):
        """:meth:`Run.style` of the group's runs (one algo)."""
        return self.runs[0].style(key, default)

    @property
    def noisy(self) -> bool:
        """Whether its runs report a finite feature ε (a mechanism with noise and its accountant)."""
        return any(math.isfinite(v) for v in self.values_of("privacy/feature_eps"))

    def values_of(self, key: str) -> list[float]:
        return [run.value(key) for run in self.runs]


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Group by algo and by the overrides that differ between runs; seeds are aggregated."""
    keys = [k for k in varying_keys(runs) if k != "algo"]
    short = {k: SYMBOLS.get(k.rsplit(".", 1)[-1], k.rsplit(".", 1)[-1]) for k in keys}
    if len(set(short.values())) < len(short):
        short = {k: k for k in keys}
    groups: dict[tuple, Group] = {}
    for run in runs:
        values = {k: run.overrides.get(k) for k in keys}
        key = (run.algo, *values.values())
        if key not in groups:
            shown = [f"{short[k]}={v}" for k, v in values.items() if v is not None]
            groups[key] = Group(" ".join([run.algo, *shown]), values, [])
        groups[key].runs.append(run)
    return list(groups.values())


def relabel(groups: Sequence[Group]) -> list[Group]:
    """The same groups labelled only by the values that differ among them (for a figure that
    shows a subset); the original labels when that would make two labels equal."""
    keys = sorted({k for g in groups for k in g.values})
    keys = [k for k in keys if len({g.values.get(k) for g in groups}) > 1]
    short = {k: SYMBOLS.get(k.rsplit(".", 1)[-1], k.rsplit(".", 1)[-1]) for k in keys}
    labels = [
        " ".join([g.algo, *(f"{short[k]}={g.values[k]}" for k in keys if g.values.get(k))])
        for g in groups
    ]
    if len(set(labels)) < len(labels):
        return list(groups)
    return [Group(label, g.values, g.runs) for label, g in zip(labels, groups)]


def sweep_commands(runs: Iterable[Run]) -> list[str]:
    """The command line of every multirun sweep among ``runs`` (from its multirun.yaml), or of
    each single run (its overrides)."""
    commands: list[str] = []
    for run in runs:
        if run.sweep is not None and (run.sweep / "multirun.yaml").is_file():
            task = yaml.safe_load((run.sweep / "multirun.yaml").read_text())["hydra"]["overrides"][
                "task"
            ]
            command = "python train.py -m " + " ".join(shlex.quote(str(t)) for t in task)
        else:
            overrides = run.path / ".hydra" / "overrides.yaml"
            items = yaml.safe_load(overrides.read_text()) if overrides.is_file() else []
            command = "python train.py " + " ".join(shlex.quote(str(t)) for t in items or [])
        if command not in commands:
            commands.append(command.rstrip())
    return commands
