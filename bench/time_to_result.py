"""Time to result: a whole run through ``train()`` (default logging: W&B offline, checkpoints,
progress bar) against the same party models + head trained as one model in a plain PyTorch loop.

For each protocol, in one process and alternating, it times ``train(cfg)`` (fit, one validation
pass per epoch, test) and a plain loop over the same batches, epochs and validation/test passes
with the same modules (deep copies, fused as the protocol fuses, one optimizer of the same kind).
The ratio is run_s / central_s; medians over ``--repeats``. Beside the wall-clock ratio it
reports:

- ``min_ratio``: the fastest run over the fastest central loop of the repeats (each the repeat
  least disturbed by other work on the machine, the estimate ``timeit`` recommends for CPU-bound
  code);

- ``cpu_ratio``: the same ratio in CPU seconds of this process (all its threads), which a machine
  shared with other jobs disturbs much less than wall time (W&B's service process is not in it);
- ``floor_s`` / ``floor_ratio``: the central model trained through a bare Lightning loop (a
  manual-optimization module whose ``training_step`` is the central step, no logger, no callbacks)
  on the same batches and evaluations: the part of a run's cost that Lightning's per-batch loop
  imposes before any protocol runs;
- ``per_update_ratio``: run_s over a central loop that makes as many optimizer updates as the run
  made server updates (``global_step``), each batch stepped that many times in a row. It differs
  from ``ratio`` only where one batch is several server updates (cascade's client passes: an epoch
  is M server iterations per batch).

Once per process, and outside the ratios: the interpreter start-up with the library imported,
and W&B's first ``init`` (its service start). Then one cProfile of each run, top entries by own
time and by cumulative time. ``--breakdown``: one more run and Lightning floor per workload,
their thread-CPU split into phases (the protocol's training steps, Lightning's per-batch loop
around them, evaluation loops, checkpoint saves, the rest: setup, test, teardown), each phase
also over the central loop's CPU, so the phases add up to the CPU ratio and show what keeps it
above a goal.

    python bench/time_to_result.py --algos npq pbm cascade fedvs --json out.json

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

from vfl_lightning import lightning_speedups  # noqa: E402
from vfl_lightning.train import build, train  # noqa: E402

lightning_speedups.use(True)  # as train() does by default (lightning_speedups=true)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from phase_clock import PHASES, PhaseClock, print_breakdown, run_phases  # noqa: E402
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


class CentralInLightning(L.LightningModule):
    """The central model trained by Lightning: ``training_step`` is the plain loop's step."""

    def __init__(self, model: nn.Module, optimizer) -> None:
        super().__init__()
        self.model = model
        self.optimizer_factory = optimizer
        self.automatic_optimization = False

    def configure_optimizers(self):
        return self.optimizer_factory(self.model.parameters())

    def training_step(self, batch, batch_idx):
        xs, y, _ = batch
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(self.model(xs), y)
        self.manual_backward(loss)
        optimizer.step()
        return loss

    def validation_step(self, batch, batch_idx):
        xs, y, _ = batch
        return (self.model(xs).argmax(-1) == y).sum()

    test_step = validation_step


def central_model(cfg: DictConfig):
    """(datamodule, the run's initial party modules + head as one model, its optimizer)."""
    L.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    model = Centralized(
        copy.deepcopy(module.parties), copy.deepcopy(module.head), module.mechanism.fusion
    )
    return datamodule, model, instantiate(cfg.optimizer)(model.parameters())


def central_loop(cfg: DictConfig, batches: int, updates_per_batch: int = 1) -> tuple[float, float]:
    """(wall s, CPU s) for ``batches`` training batches of the centralized model (epoch by epoch
    on the run's own data loaders, ``updates_per_batch`` optimizer steps on each), a validation
    pass after each epoch and a test pass at the end."""
    datamodule, model, optimizer = central_model(cfg)

    def evaluate(loader) -> float:
        model.eval()
        correct = torch.zeros((), dtype=torch.int64)
        with torch.no_grad():
            for xs, y, _ in loader:
                correct += (model(xs).argmax(-1) == y).sum()
        model.train()
        return correct.item()

    start, cpu = time.perf_counter(), time.process_time()
    done, epoch = 0, 0
    while done < batches:
        loader = datamodule.train_dataloader()
        loader.sampler.set_epoch(epoch)
        epoch_loss = torch.zeros(())
        for xs, y, _ in loader:
            for _ in range(updates_per_batch):
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
    return time.perf_counter() - start, time.process_time() - cpu


def lightning_floor(cfg: DictConfig, batches: int) -> float:
    """Wall s of the central model trained by a bare Lightning loop (no logger, no callbacks, no
    sanity check) for ``batches`` batches with a validation per epoch and a test pass."""
    datamodule, model, _ = central_model(cfg)
    module = CentralInLightning(model, instantiate(cfg.optimizer))
    trainer = L.Trainer(
        max_steps=batches,
        max_epochs=-1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    start = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    trainer.test(module, datamodule=datamodule, verbose=False)
    return time.perf_counter() - start


def timed_run(cfg: DictConfig) -> tuple[float, float, int, int]:
    """(wall s, CPU s of ``train(cfg)``, training batches it processed, server updates)."""
    start, cpu = time.perf_counter(), time.process_time()
    results = train(cfg)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return seconds, cpu, COUNTERS[-1].batches, int(results["global_step"])


def breakdown(cfg: DictConfig, batches: int) -> dict[str, dict[str, float]]:
    """Thread-CPU seconds of one run and one Lightning floor by phase (:data:`PHASES`), and the
    central loop's CPU seconds."""
    clock = PhaseClock()
    with clock.watch(run_phases(CentralInLightning)):
        run = clock.measure(lambda: train(cfg))
        floor = clock.measure(lambda: lightning_floor(cfg, batches))
    return {
        "run": {phase: run.get(phase, 0.0) for phase in PHASES},
        "floor": {phase: floor.get(phase, 0.0) for phase in PHASES},
        "central": {"total": central_loop(cfg, batches)[1]},
    }


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
    parser.add_argument(
        "--breakdown", action="store_true", help="one more run and floor split into phases"
    )
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
        rows = []
        for repeat in range(args.repeats):
            cfg = run_config(algo, workdir / f"{algo}-{repeat}", args.epochs)
            run_s, run_cpu, batches, updates = timed_run(cfg)
            central_s, central_cpu = central_loop(cfg, batches)
            per_batch = max(1, round(updates / batches))
            central_updates_s = (
                central_loop(cfg, batches, per_batch)[0] if per_batch > 1 else central_s
            )
            floor_s = lightning_floor(cfg, batches)
            rows.append(
                {
                    "run_s": run_s,
                    "central_s": central_s,
                    "ratio": run_s / central_s,
                    "cpu_ratio": run_cpu / central_cpu,
                    "floor_s": floor_s,
                    "floor_ratio": floor_s / central_s,
                    "central_updates_s": central_updates_s,
                    "per_update_ratio": run_s / central_updates_s,
                }
            )
        results[algo] = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        results[algo] |= {
            "batches": batches,
            "server_updates": updates,
            # fastest run over fastest central loop: each is the repeat least disturbed by other
            # work on the machine (on a shared machine single ratios can swing by a third)
            "min_ratio": min(row["run_s"] for row in rows) / min(row["central_s"] for row in rows),
            "ratios": [row["ratio"] for row in rows],
            "interpreter_s": interpreter,
            "wandb_first_init_s": wandb_init,
        }
        if args.profile_top:
            cfg = run_config(algo, workdir / f"{algo}-profile", args.epochs)
            profiles[algo] = profile_top(cfg, args.profile_top)
        if args.breakdown:
            cfg = run_config(algo, workdir / f"{algo}-breakdown", args.epochs)
            results[algo]["breakdown"] = breakdown(cfg, batches)
        print(f"{algo}: done ({batches} batches per run)", flush=True)
    for algo, text in profiles.items():
        print(f"\n=== profile: {algo} ===\n{text}")
    header = (
        "| algo | batches | server updates | run s | central s | **ratio** | min/min ratio | "
        "CPU ratio | Lightning floor ratio | per-update ratio | ratios |"
    )
    print("\n" + header)
    print("|" + "---|" * (header.count("|") - 1))
    for algo, row in results.items():
        each = " ".join(f"{r:.2f}" for r in row["ratios"])
        print(
            f"| {algo} | {row['batches']} | {row['server_updates']} | {row['run_s']:.2f} | "
            f"{row['central_s']:.3f} | **{row['ratio']:.2f}** | {row['min_ratio']:.2f} | "
            f"{row['cpu_ratio']:.2f} | "
            f"{row['floor_ratio']:.2f} | {row['per_update_ratio']:.2f} | {each} |"
        )
    if args.breakdown:
        print_breakdown(results)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
