"""Time to result: a whole run through ``train()`` (default logging: W&B offline, checkpoints,
progress bar) against the same party models + head trained as one model in a plain PyTorch loop.

For each protocol, in one process and alternating, it times ``train(cfg)`` (fit, one validation
pass per epoch, test) and a plain loop over the same batches, epochs and validation/test passes
with the same modules (deep copies, fused as the protocol fuses, one optimizer of the same kind).
The ratio is run_s / central_s; medians over ``--repeats``. Once per process, and outside the
ratio: the interpreter start-up with the library imported, and W&B's first ``init`` (its service
start). Then one cProfile of each run, top entries by own time and by cumulative time.

    python bench/time_to_result.py --algos npq pbm cascade fedvs --epochs 10 --json out.json

Workloads: digits defaults (npq, pbm), ``experiment=cascade_digits`` (cascade),
``experiment=fedvs_digits`` (fedvs; central = the same PN parties + head, plain mean).
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = str(ROOT / "conf")

from vfl_lightning.train import build, train  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_overhead import Centralized  # noqa: E402  (the same centralized model)

WORKLOADS = {
    "npq": ["algo=npq"],
    "pbm": ["algo=pbm"],
    "cascade": ["experiment=cascade_digits"],
    "fedvs": ["experiment=fedvs_digits"],
}


class BatchCounter(L.Callback):
    """Counts the training batches a run processed, so the central loop does as many."""

    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.batches += 1


COUNTERS: list[BatchCounter] = []


def make_counter() -> BatchCounter:
    COUNTERS.append(BatchCounter())
    return COUNTERS[-1]


def run_config(algo: str, output_dir: Path, epochs: int | None, extra=()) -> DictConfig:
    """The config ``python train.py <workload>`` runs (defaults: W&B offline, checkpoints, bar)."""
    overrides = [*WORKLOADS[algo], "trainer.accelerator=cpu", *extra]
    if epochs is not None:
        overrides.append(f"trainer.max_epochs={epochs}")
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        cfg.callbacks.bench_counter = {"_target_": f"{__name__}.make_counter"}
        del cfg["hydra"]
    GlobalHydra.instance().clear()
    return cfg


def central_loop(cfg: DictConfig, batches: int) -> float:
    """Seconds for ``batches`` training steps of the centralized model (epoch by epoch on the
    run's own data loaders), a validation pass after each epoch and a test pass at the end."""
    L.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    model = Centralized(
        copy.deepcopy(module.parties), copy.deepcopy(module.head), module.mechanism.fusion
    )
    optimizer = instantiate(cfg.optimizer)(model.parameters())

    def evaluate(loader) -> float:
        model.eval()
        correct = torch.zeros((), dtype=torch.int64)
        with torch.no_grad():
            for xs, y, _ in loader:
                correct += (model(xs).argmax(-1) == y).sum()
        model.train()
        return correct.item()

    start = time.perf_counter()
    done, epoch = 0, 0
    while done < batches:
        loader = datamodule.train_dataloader()
        loader.sampler.set_epoch(epoch)
        epoch_loss = torch.zeros(())
        for xs, y, _ in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(xs), y)
            loss.backward()
            optimizer.step()
            epoch_loss += loss.detach()
            done += 1
            if done == batches:
                break
        epoch_loss.item()
        evaluate(datamodule.val_dataloader())
        epoch += 1
    evaluate(datamodule.test_dataloader())
    return time.perf_counter() - start


def timed_run(cfg: DictConfig) -> tuple[float, int]:
    """(seconds of ``train(cfg)``, training batches it processed)."""
    start = time.perf_counter()
    train(cfg)
    seconds = time.perf_counter() - start
    return seconds, COUNTERS[-1].batches


def interpreter_start_s() -> float:
    """Seconds for a fresh interpreter to import the library, Lightning and W&B and exit."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import wandb, lightning, vfl_lightning.train"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return time.perf_counter() - start


def wandb_first_init_s(directory: Path) -> float:
    """Seconds of the first offline W&B run (init + finish, as the default logger does it) in
    this process; later runs reuse W&B's service and pay about a tenth of it."""
    import wandb
    from lightning.pytorch.loggers import WandbLogger

    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    WandbLogger(project="vfl_bench", save_dir=str(directory), offline=True).log_hyperparams({})
    wandb.finish()
    return time.perf_counter() - start


def profile_top(cfg: DictConfig, top: int) -> str:
    """One profiled run: the top entries by own time and by cumulative time (wrappers skipped)."""
    profiler = cProfile.Profile()
    profiler.enable()
    train(cfg)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    total = stats.total_tt
    out.write(f"total {total:.2f} s (profiled)\n-- by own time --\n")
    stats.sort_stats("tottime").print_stats(top)
    rows = []
    for (file, line, name), (_, _, _, cumulative, _) in stats.stats.items():
        interesting = any(k in file for k in ("vfl_lightning", "sync", "base", "pbm", "fedvs"))
        if cumulative < 0.6 * total and (
            interesting or name in ("log", "log_dict", "step", "save_checkpoint")
        ):
            rows.append((cumulative, f"{file}:{line}({name})"))
    out.write("-- by cumulative time (library functions, self.log, optimizer steps) --\n")
    for cumulative, where in sorted(rows, reverse=True)[:top]:
        out.write(f"{cumulative:9.3f} s {100 * cumulative / total:5.1f}%  {where}\n")
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--epochs", type=int, default=None, help="default: the workload's own")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--profile-top", type=int, default=12, help="0: no profile")
    parser.add_argument("--json", type=Path, default=None, help="write the table as JSON here")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.epochs is not None and args.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {args.epochs}")
    torch.set_num_threads(args.threads)
    os.environ.pop("WANDB_MODE", None)
    workdir = Path(tempfile.mkdtemp(prefix="vfl_time_to_result_"))
    interpreter = interpreter_start_s()
    wandb_init = wandb_first_init_s(workdir / "wandb_once")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), epochs "
        f"{args.epochs or 'workload default'}, {args.repeats} repeats (medians)\n"
        f"once per process, not in the ratios: interpreter start + imports {interpreter:.2f} s, "
        f"W&B first offline init {wandb_init:.2f} s",
        flush=True,
    )
    results: dict[str, dict] = {}
    profiles: dict[str, str] = {}
    for algo in args.algos:
        # warm-up: one short run, so one-time costs (imports, first compiles) stay outside
        train(run_config(algo, workdir / f"{algo}-warmup", 1))
        runs, centrals, ratios = [], [], []
        for repeat in range(args.repeats):
            cfg = run_config(algo, workdir / f"{algo}-{repeat}", args.epochs)
            run_s, batches = timed_run(cfg)
            central_s = central_loop(cfg, batches)
            runs.append(run_s)
            centrals.append(central_s)
            ratios.append(run_s / central_s)
        results[algo] = {
            "run_s": statistics.median(runs),
            "central_s": statistics.median(centrals),
            "ratio": statistics.median(ratios),
            "batches": batches,
            "ratios": ratios,
            "interpreter_s": interpreter,
            "wandb_first_init_s": wandb_init,
        }
        if args.profile_top:
            cfg = run_config(algo, workdir / f"{algo}-profile", args.epochs)
            profiles[algo] = profile_top(cfg, args.profile_top)
        print(f"{algo}: done ({batches} batches per run)", flush=True)
    for algo, text in profiles.items():
        print(f"\n=== profile: {algo} ===\n{text}")
    print(f"\n| {'algo':8} | {'run s':>7} | {'central s':>9} | {'ratio':>6} | ratios |")
    print("|----------|---------|-----------|--------|--------|")
    for algo, row in results.items():
        each = " ".join(f"{r:.2f}" for r in row["ratios"])
        print(
            f"| {algo:8} | {row['run_s']:>7.2f} | {row['central_s']:>9.3f} | "
            f"{row['ratio']:>6.2f} | {each} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
