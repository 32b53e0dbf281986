"""Where a run's CPU time goes: thread-CPU seconds spent inside chosen methods, each second
counted once, in the innermost phase running (bench/time_to_result.py ``--breakdown``)."""

from __future__ import annotations

import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable, Iterator


class PhaseClock:
    """Thread-CPU seconds by phase. :meth:`watch` wraps methods of classes so that time spent
    inside them is counted under a phase name; a phase entered inside another (a validation
    loop run from inside a training loop's method) takes its own time out of the outer one, so
    the phases add up to the time measured inside the outermost ones. Time outside every watched
    method is not counted: :meth:`measure` reports it as ``other``.

    Only the thread that calls the methods is measured (``time.thread_time``), so other threads
    and processes (W&B's service, a checkpoint writer) are left out."""

    OTHER = "other"

    def __init__(self, clock: Callable[[], float] = time.thread_time) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self._stack: list[str] = []
        self._since = 0.0

    def _enter(self, phase: str) -> None:
        now = self.clock()
        if self._stack:
            self.seconds[self._stack[-1]] += now - self._since
        self._stack.append(phase)
        self.calls[phase] += 1
        self._since = now

    def _leave(self) -> None:
        now = self.clock()
        self.seconds[self._stack.pop()] += now - self._since
        self._since = now

    @contextlib.contextmanager
    def watch(self, methods: dict[tuple[type, str], str]) -> Iterator[PhaseClock]:
        """While inside, every ``(class, method name)`` of ``methods`` counts its time under its
        phase name; the original methods are put back on exit."""
        originals = []
        try:
            for (owner, name), phase in methods.items():
                original = owner.__dict__[name]
                originals.append((owner, name, original))
                setattr(owner, name, self._timed(original, phase))
            yield self
        finally:
            for owner, name, original in reversed(originals):
                setattr(owner, name, original)

    def _timed(self, function: Callable, phase: str) -> Callable:
        @functools.wraps(function)
        def timed(*args, **kwargs):
            self._enter(phase)
            try:
                return function(*args, **kwargs)
            finally:
                self._leave()

        return timed

    def measure(self, function: Callable[[], object]) -> dict[str, float]:
        """Run ``function`` and return the thread-CPU seconds of each phase during it, plus
        ``other`` (the rest of its time) and ``total``."""
        self.seconds.clear()
        self.calls.clear()
        start = self.clock()
        function()
        total = self.clock() - start
        phases = dict(self.seconds)
        return phases | {self.OTHER: total - sum(phases.values()), "total": total}


PHASES = ("step", "batch", "evaluation", "checkpoint", PhaseClock.OTHER, "total")
"""The phases of a run (:func:`run_phases`), then ``other`` (the rest of ``train()``: checks,
build, W&B, trainer, teardown, results) and ``total``."""


def run_phases(*central: type) -> dict[tuple[type, str], str]:
    """The methods of a run by phase: ``step`` every protocol's ``training_step`` (and that of
    the ``central`` Lightning modules), ``batch`` Lightning's per-batch loop around it (data,
    hooks, callbacks, logging), ``evaluation`` every validation and test loop, ``checkpoint``
    the checkpoint saves."""
    from lightning.pytorch.loops.evaluation_loop import _EvaluationLoop
    from lightning.pytorch.loops.training_epoch_loop import _TrainingEpochLoop

    from vfl_lightning.algorithms.asynchronous import HybridVFL
    from vfl_lightning.algorithms.fedvs import FedVSFamily
    from vfl_lightning.algorithms.sync import SyncVFL
    from vfl_lightning.checkpoints import LastCheckpoint

    steps = (SyncVFL, HybridVFL, FedVSFamily, *central)
    return {(cls, "training_step"): "step" for cls in steps} | {
        (_TrainingEpochLoop, "advance"): "batch",
        (_EvaluationLoop, "run"): "evaluation",
        (LastCheckpoint, "_save"): "checkpoint",
    }


def party_check_phases() -> dict[tuple[object, str], str]:
    """The party-side checks as the local parties call them, each its own phase (module
    functions where they are looked up): a guard's release checks, its budget's check and
    count, a coded share's count, the received gradients' check, the conversion of a batch's
    rows."""
    from vfl_lightning.algorithms import fedvs_parties, local_parties, party
    from vfl_lightning.algorithms.party_rules import PartyGuard

    guard = ("check_release", "check_budget", "record_release", "coded_release")
    return (
        {(PartyGuard, name): name for name in guard}
        | {(party, "checked_gradients"): "checked_gradients"}
        | {(module, "release_rows"): "release_rows" for module in (local_parties, fedvs_parties)}
    )


def print_breakdown(results: dict[str, dict]) -> None:
    """The ``breakdown`` of each workload in ``results`` as a markdown table: each phase's CPU
    seconds in the run and in the Lightning floor, and over the central loop's CPU seconds."""
    print("\n| algo | phase | run CPU s | floor CPU s | run / central CPU | floor / central CPU |")
    print("|---|---|---|---|---|---|")
    for algo, row in results.items():
        parts = row.get("breakdown")
        if parts is None:
            continue
        central = parts["central"]["total"]
        for phase in PHASES:
            run, floor = parts["run"][phase], parts["floor"][phase]
            print(
                f"| {algo} | {phase} | {run:.3f} | {floor:.3f} | {run / central:.2f} | "
                f"{floor / central:.2f} |"
            )
        print(f"| {algo} | central loop | | | {central:.3f} s | |")
