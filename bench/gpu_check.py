"""Every protocol family on an accelerator against the CPU, with a guard on device placement.

For each family (sync/pbm, ldp, fedbcd, async/cascade, fedvs) it trains the same configuration
with the same seed for ``--steps`` optimizer steps on ``--device`` and on the CPU, and compares
the test accuracies: they must agree within ``--tolerance`` (absolute; default 0.05: float kernels
on a GPU round differently, so the two runs follow nearby but not identical trajectories; the
exact parts, masks and field arithmetic, are exact on both). Every training and validation batch
on the device runs under :class:`DeviceGuard`, a torch dispatch mode that sees every aten op
(autograd's backward included) and records each op that takes a tensor on the device and returns
one on the CPU: the check FAILS on any such move of a non-scalar tensor. Scalar reads (``.item()``,
``bool()``, a one-element copy) and CPU tensors created without any device input are counted
and printed with the first place in vfl_lightning that made them, not failed.

Then it prints training steps/s of a ``pbm_cifar10``-sized model: PBM-VFL with four ResNet-18
parties on the 16 x 16 quadrants of 32 x 32 colour images (random images, 10 classes), linear
head, batch 100 (the paper's), on ``--device``.

    python bench/gpu_check.py                     # CUDA against the CPU (needs a GPU)
    python bench/gpu_check.py --device cpu        # the CPU alone: the same runs, no comparison
    python bench/gpu_check.py --families pbm fedvs --steps 300 --tolerance 0.05

Exit status 1 when a family moves a tensor to the CPU or misses the tolerance.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

import lightning as L
import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

from conftest import compose_config  # noqa: E402

from vfl_lightning.data.raw import RawDataset  # noqa: E402
from vfl_lightning.train import train  # noqa: E402

FAMILIES = {
    "pbm": ["algo=pbm"],
    "ldp": ["algo=ldp"],
    "fedbcd": ["experiment=fedbcd_digits"],
    "cascade": ["experiment=cascade_digits"],
    "fedvs": ["experiment=fedvs_digits"],
}
"""The families' configurations (digits, the quick settings of each protocol)."""

COMMON = [
    "logger=none",
    "trainer.enable_progress_bar=false",
    "trainer.num_sanity_val_steps=0",
    "callbacks.checkpoint=null",
]
RANDOM_IMAGES = "random_cifar10_shape"


def _site() -> str:
    """The innermost frame in vfl_lightning that led to the current op."""
    for frame in reversed(traceback.extract_stack()):
        if "vfl_lightning" in frame.filename:
            return f"{Path(frame.filename).name}:{frame.lineno} {frame.name}"
    return "outside vfl_lightning"


class DeviceGuard(TorchDispatchMode):
    """Records, for every aten op, whether it moved a tensor off ``device``.

    ``moves``: ops with an input on ``device`` and a non-scalar output elsewhere (by site).
    ``scalar_reads``: one-element reads back to the host (``.item()``, ``bool()``, ...).
    ``host_created``: non-scalar outputs off ``device`` from ops without any input on it.
    """

    def __init__(self, device: torch.device | str) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.moves: Counter[str] = Counter()
        self.scalar_reads = 0
        self.host_created: Counter[str] = Counter()

    def _on_device(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self.device.type

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.scalar_reads += 1
            return out
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        from_device = any(self._on_device(t) for t in inputs)
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor) or self._on_device(tensor):
                continue
            if tensor.numel() <= 1:
                self.scalar_reads += from_device
            elif from_device:
                self.moves[f"{func} at {_site()}"] += 1
            else:
                self.host_created[f"{func} at {_site()}"] += 1
        return out


class GuardSteps(L.Callback):
    """Runs every training and validation batch under ``guard``; counts the optimizer steps."""

    def __init__(self, guard: DeviceGuard | None) -> None:
        self.guard = guard
        self.steps = 0
        self.active = False

    def _enter(self, *_) -> None:
        if self.guard is not None and not self.active:
            self.guard.__enter__()
            self.active = True

    def _exit(self, *_) -> None:
        if self.active:
            self.guard.__exit__(None, None, None)
            self.active = False

    on_train_batch_start = on_validation_batch_start = _enter
    on_validation_batch_end = on_exception = _exit

    def on_train_batch_end(self, trainer, *_) -> None:
        self._exit()
        self.steps = trainer.global_step


CURRENT: GuardSteps | None = None


def current_guard() -> GuardSteps:
    """The callback instance of the run in progress (Hydra instantiates it by this target)."""
    return CURRENT


def run_family(
    overrides: list[str], device: str, steps: int, work: Path
) -> tuple[dict, GuardSteps]:
    """Train one configuration on ``device`` for ``steps`` steps; (results, guard callback)."""
    global CURRENT
    accelerator = "gpu" if device == "cuda" else device
    CURRENT = GuardSteps(DeviceGuard(device) if device != "cpu" else None)
    cfg = compose_config(
        work,
        *overrides,
        *COMMON,
        f"trainer.accelerator={accelerator}",
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=1000",
        "+callbacks.guard._target_=gpu_check.current_guard",
    )
    results = train(cfg)
    return results, CURRENT


def random_images(data_dir=None, n_samples: int = 1000) -> RawDataset:
    """Random 3 x 32 x 32 images with 10 classes (the shape of CIFAR-10; only for timing)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n_samples, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, n_samples).astype(np.int64)
    return RawDataset(RANDOM_IMAGES, x, y, 10, is_image=True)


def steps_per_second(device: str, steps: int, batch: int, work: Path) -> float:
    """PBM-VFL with four ResNet-18 parties on the quadrants of 32 x 32 images, ``batch`` rows a
    step: training steps/s, timed after one warm-up step (the device synchronized at both ends)."""
    timer = StepTimer(device)
    cfg = compose_config(
        work,
        "algo=pbm",
        "data=cifar10",
        f"data.name={RANDOM_IMAGES}",
        "data.loader=gpu_check.random_images",
        "party=resnet18",
        f"data.batch_size={batch}",
        *COMMON,
        f"trainer.accelerator={'gpu' if device == 'cuda' else device}",
        f"trainer.max_steps={steps + 1}",
        "trainer.limit_val_batches=0",
        "trainer.limit_test_batches=0",
        "+callbacks.timer._target_=gpu_check.current_timer",
    )
    global TIMER
    TIMER = timer
    train(cfg)
    return timer.rate()


class StepTimer(L.Callback):
    """Wall time from the end of the first training batch to the end of the last."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.marks: list[float] = []

    def on_train_batch_end(self, *_) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()
        self.marks.append(time.perf_counter())

    def rate(self) -> float:
        if len(self.marks) < 2:
            raise RuntimeError("the speed run took fewer than 2 steps")
        return (len(self.marks) - 1) / (self.marks[-1] - self.marks[0])


TIMER: StepTimer | None = None


def current_timer() -> StepTimer:
    return TIMER


def report_guard(guard: DeviceGuard) -> None:
    print(f"    scalar reads to the host: {guard.scalar_reads}")
    for site, count in guard.host_created.most_common(5):
        print(f"    host-created tensors: {count} x {site}")
    for site, count in guard.moves.most_common():
        print(f"    MOVED TO THE CPU: {count} x {site}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda", help="cuda (against the CPU) or cpu (alone)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--steps", type=int, default=None, help="default: 300 (cuda), 30 (cpu)")
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--speed-steps", type=int, default=None, help="default: 50 (cuda), 2 (cpu)")
    parser.add_argument(
        "--speed-batch", type=int, default=None, help="default: 100, the paper's (cuda), 4 (cpu)"
    )
    parser.add_argument("--work", default=None, help="run folder (default: a temporary one)")
    args = parser.parse_args(argv)
    if args.device not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda needs a CUDA GPU; none is visible (use --device cpu)")
    on_device = args.device == "cuda"
    steps = args.steps or (300 if on_device else 30)
    speed_steps = args.speed_steps or (50 if on_device else 2)
    speed_batch = args.speed_batch or (100 if on_device else 4)
    import tempfile

    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_"))
    name = torch.cuda.get_device_name() if on_device else "CPU"
    print(f"torch {torch.__version__}, device {args.device} ({name}), {steps} steps per run")
    failed = False
    for family in args.families:
        overrides = [*FAMILIES[family], "seed=0"]
        results, callback = run_family(overrides, args.device, steps, work / family / args.device)
        accuracy = results["test/acc"]
        line = f"{family}: {callback.steps} steps, test acc {accuracy:.4f} on {args.device}"
        if not on_device:
            print(line)
            continue
        cpu_results, _ = run_family(overrides, "cpu", steps, work / family / "cpu")
        gap = abs(accuracy - cpu_results["test/acc"])
        ok = gap <= args.tolerance and not callback.guard.moves
        failed |= not ok
        print(
            f"{line}, {cpu_results['test/acc']:.4f} on cpu, gap {gap:.4f} "
            f"(tolerance {args.tolerance}): {'ok' if ok else 'FAIL'}"
        )
        report_guard(callback.guard)
    rate = steps_per_second(args.device, speed_steps, speed_batch, work / "speed")
    print(
        f"pbm_cifar10-sized (4 ResNet-18 parties, 16 x 16 quadrants, batch {speed_batch}): "
        f"{rate:.2f} steps/s on {args.device} ({name})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    # run as the module ``gpu_check``, the name the callbacks' Hydra targets import
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gpu_check

    sys.exit(gpu_check.main())
