"""The few lines a run prints when it ends: final metrics, privacy, every attack's and audit's
headline, communication, time, cost to target, where the results and the W&B run are, and the
model digest (rank 0 only)."""

from __future__ import annotations

import math
import shlex
from pathlib import Path

from lightning.fabric.utilities.rank_zero import rank_zero_only

# Metric suffixes shown, in this order, for the val/ and test/ splits.
SHOWN_METRICS = ("acc", "acc_clean", "auroc", "auprc", "loss")


def _number(value, digits: int = 4) -> str:
    if value == "inf" or value == math.inf:
        return "∞"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}"


def _metrics_line(results: dict, split: str) -> str | None:
    shown = [
        f"{name} {results[f'{split}/{name}']:.4f}"
        for name in SHOWN_METRICS
        if isinstance(results.get(f"{split}/{name}"), float | int)
    ]
    return f"  {split:<5} " + ", ".join(shown) if shown else None


def _privacy_line(results: dict) -> str | None:
    if results.get("privacy/feature_eps") is None:
        return None
    line = f"  privacy: feature ε {_number(results['privacy/feature_eps'])}"
    if results.get("privacy/sample_eps") is not None:
        line += f", sample ε {_number(results['privacy/sample_eps'])}"
    if results.get("privacy/eval_feature_eps") is not None:
        line += f", evaluation feature ε {_number(results['privacy/eval_feature_eps'])}"
    return line + f" at δ = {_number(results.get('privacy/delta'))}"


def headline_lines(results: dict) -> list[str]:
    """One line per attack and audit the run reported: its declared headline metric
    (``attack/<name>/headline``, ``audit/<name>/headline``), and the one beside it if declared."""
    lines = []
    for key in sorted(results):
        kind, _, rest = key.partition("/")
        name, _, field = rest.rpartition("/")
        headline = results[key]
        if kind not in ("attack", "audit") or field != "headline" or not isinstance(headline, dict):
            continue
        metric = headline.get("metric")
        line = f"  {kind} {name}: {metric} {_number(results.get(f'{kind}/{name}/{metric}'))}"
        versus = headline.get("versus")
        if versus:
            line += f" (beside {versus} {_number(results.get(f'{kind}/{name}/{versus}'))})"
        lines.append(line)
    return lines


def _data_line(results: dict) -> str | None:
    """The rows trained on (held by every party, when the PSI aligned them) and VertiBench's
    α and β of the split."""
    rows = results.get("data/aligned_rows")
    if rows is None:
        return None
    line = f"  data: {rows} rows"
    if results.get("comm/psi_mb"):
        line += f" held by every party (PSI, {_number(results['comm/psi_mb'])} MB)"
    if "data/split_alpha" in results:
        line += (
            f", split α {_number(results.get('data/split_alpha'))}, "
            f"β {_number(results.get('data/split_beta'))}"
        )
    return line


def _target_line(results: dict) -> str | None:
    value = results.get("target_value")
    if value is None:
        return None
    head = f"  target: {results.get('target_metric')} ≥ {_number(value)}"
    if results.get("epoch_to_target") is None:
        return head + " not reached"
    return (
        f"{head} reached at epoch {results['epoch_to_target']}, round "
        f"{_number(results.get('rounds_to_target'), 6)}, {_number(results.get('mb_to_target'))} MB"
    )


def wandb_line(output_dir: Path) -> str | None:
    """Where the W&B run is: the `wandb sync` command of an offline run."""
    offline = sorted(Path(output_dir).glob("wandb/offline-run-*"))
    if not offline:
        return None
    return f"  W&B (offline), upload with: wandb sync {shlex.quote(str(offline[-1]))}"


def run_summary(results: dict, output_dir: str | Path) -> str:
    """The end-of-run summary of ``results`` (the results.json dictionary)."""
    parties = results.get("num_parties")
    who = f"{results.get('algo')} on {results.get('data')}"
    if parties:
        who += f" ({parties} parties)"
    rounds = _number(results.get("comm/rounds"), 9)
    lines = [
        f"run {results.get('status')}: {who}, seed {results.get('seed')}, "
        f"{results.get('epochs')} epochs, {rounds} rounds",
        _metrics_line(results, "val"),
        _metrics_line(results, "test"),
        _privacy_line(results),
        _data_line(results),
        *headline_lines(results),
        f"  communication: {_number(results.get('comm/total_mb'))} MB (uplink "
        f"{_number(results.get('comm/uplink_mb'))}, downlink "
        f"{_number(results.get('comm/downlink_mb'))})",
        f"  time: {_number(results.get('time/wall_s'), 3)} s wall, "
        f"{_number(results.get('time/simulated_s'), 3)} s simulated",
        _target_line(results),
        wandb_line(Path(output_dir)),
        f"results: {Path(output_dir) / 'results.json'}",
        f"model_digest ({results.get('runtime')}): {results.get('model_digest')}",
    ]
    return "\n".join(line for line in lines if line)


@rank_zero_only
def print_summary(results: dict, output_dir: str | Path) -> None:
    """Print the summary of a finished run, or the results path of one that did not finish
    (its error line is printed by the command line); rank 0 alone prints under DDP."""
    if results.get("status") == "finished":
        print(run_summary(results, output_dir), flush=True)
    else:
        print(f"results ({results.get('status')}): {Path(output_dir) / 'results.json'}", flush=True)
