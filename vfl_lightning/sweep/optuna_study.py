"""``hydra/sweeper=vfl_optuna``: an Optuna study driven by asking for trials, launching them with
Hydra's configured launcher (basic: one after another in this process; joblib: in parallel
processes) and telling Optuna their results. The study lives in a storage (by default a journal
file in the sweep directory), so a command killed mid-study resumes it, and several commands
given the same storage share it."""

from __future__ import annotations

import fcntl
import logging
import math
import os
import socket
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, Trial, TrialState

from vfl_lightning.errors import ConfigError
from vfl_lightning.run.job_checks import job_problem
from vfl_lightning.sweep.space import SearchSpace, search_space

log = logging.getLogger(__name__)

SETTINGS = (
    "sampler",
    "direction",
    "storage",
    "study_name",
    "n_trials",
    "n_jobs",
    "max_failure_rate",
    "params",
)
"""The keys of ``hydra.sweeper`` (conf/hydra/sweeper/vfl_optuna.yaml)."""
DIRECTIONS = ("minimize", "maximize")
WORKER = "vfl_optuna.worker"
"""Trial user attribute: ``host pid start`` of the process that asked the trial."""
INTERRUPTED = "vfl_optuna.interrupted"
"""Study user attribute: the numbers of the trials whose process ended before their result."""
RETRY_OF = "vfl_optuna.retry_of"
"""Trial user attribute: the number of the interrupted trial it runs again."""
SPACE = "vfl_optuna.space"
"""Study user attribute: every override of the study, described (``SearchSpace.description``)."""


def refuse(message: str) -> None:
    """One ``error:`` line on stderr, exit 2 (a sweeper setting or search space that cannot run)."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (``/proc``), or None where
    unknown; with the pid it names one process even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def worker_id() -> str:
    pid = os.getpid()
    return f"{socket.gethostname()} {pid} {process_start(pid)}"


def worker_is_gone(worker: str | None) -> bool:
    """Whether the process that asked a trial is known to have ended: it ran on this host and its
    pid is free or belongs to a process started at another time. A trial asked on another host,
    or without a worker recorded, is never taken for gone."""
    if not worker:
        return False
    host, pid, start = worker.split(" ")
    if host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return start != "None" and process_start(int(pid)) != start


def trial_seed(seed: int, index: int) -> int:
    """The sampler's seed for the study's ``index``-th trial: the trials a seeded study draws do
    not depend on how many processes drew them or on a restart in between."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


class OptunaStudySweeper:
    """The sweeper behind ``hydra_plugins.vfl_optuna_sweeper`` (settings: :data:`SETTINGS`).

    ``n_trials`` is the study's total: trials already in the storage count (a resumed or shared
    study runs only the rest), except those interrupted by their process's death, which are
    recorded as failed with :data:`INTERRUPTED` and run again with the same parameters. Trials
    are asked ``n_jobs`` at a time under a lock next to the journal file, so processes sharing a
    study never run a trial twice nor more than ``n_trials`` in all; trial ``n``'s job directory
    is ``<sweep dir>/<n>``."""

    def __init__(self, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            refuse(
                f"hydra.sweeper.{unknown[0]} is not a setting of hydra/sweeper=vfl_optuna "
                f"(its settings: {', '.join(SETTINGS)})"
            )
        missing = sorted(set(SETTINGS) - set(settings))
        if missing:
            refuse(f"hydra.sweeper.{missing[0]} is missing: hydra/sweeper=vfl_optuna needs it")
        self.sampler = settings["sampler"]
        self.directions = self._directions(settings["direction"])
        self.storage = settings["storage"]
        self.study_name = settings["study_name"]
        self.n_trials = self._count("n_trials", settings["n_trials"])
        self.n_jobs = self._count("n_jobs", settings["n_jobs"])
        rate = settings["max_failure_rate"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 <= rate <= 1:
            refuse(f"hydra.sweeper.max_failure_rate={rate} must be a number in [0, 1]")
        self.max_failure_rate = float(rate)
        params = settings["params"]
        self.params = OmegaConf.to_container(params) if isinstance(params, DictConfig) else params
        if self.params is not None and not isinstance(self.params, dict):
            refuse(f"hydra.sweeper.params={params} must be a mapping of keys to overrides")
        if not isinstance(self.study_name, str) or not self.study_name:
            refuse(f"hydra.sweeper.study_name={self.study_name} must be a non-empty name")
        if self.storage is not None and (not isinstance(self.storage, str) or not self.storage):
            refuse(f"hydra.sweeper.storage={self.storage} must be a file path, a URL or null")
        sampler = self.sampler
        if not isinstance(sampler, (dict, DictConfig)) or "_target_" not in sampler:
            refuse(
                f"hydra.sweeper.sampler={sampler} must name an Optuna sampler: "
                "{_target_: optuna.samplers.TPESampler, seed: 0}"
            )
        self.seed = sampler.get("seed")
        if self.seed is not None and (type(self.seed) is not int or self.seed < 0):
            refuse(f"hydra.sweeper.sampler.seed={self.seed} must be an integer >= 0 or null")
        self.config: DictConfig | None = None

    @staticmethod
    def _directions(direction: Any) -> list[str]:
        chosen = (
            list(direction)
            if isinstance(direction, Sequence) and not isinstance(direction, str)
            else [direction]
        )
        if not chosen or any(d not in DIRECTIONS for d in chosen):
            refuse(f"hydra.sweeper.direction={direction} must be minimize, maximize or a list")
        return [str(d) for d in chosen]

    @staticmethod
    def _count(key: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            refuse(f"hydra.sweeper.{key}={value} must be an integer >= 1")
        return value

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.hydra_context = hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.sweep_dir = Path(config.hydra.sweep.dir)

    def sampler_for(self, index: int) -> optuna.samplers.BaseSampler:
        """The configured sampler, seeded for the study's ``index``-th trial (unseeded: random)."""
        if self.seed is None:
            return instantiate(self.sampler)
        return instantiate(self.sampler, seed=trial_seed(int(self.seed), index))

    def storage_object(self) -> optuna.storages.BaseStorage | str | None:
        """A URL (``sqlite:///study.db``) as it is, a path as a journal file, null in memory."""
        if self.storage is None or "://" in self.storage:
            return self.storage
        path = Path(self.storage)
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))

    @contextmanager
    def asking(self) -> Iterator[None]:
        """Held while trials are recovered and asked: an exclusive lock on ``<journal>.ask.lock``
        (released by the system when its process dies, kill -9 included); in memory or with a
        database URL, a single process is assumed."""
        if self.storage is None or "://" in self.storage:
            yield
            return
        with open(f"{self.storage}.ask.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def open_study(self, space: SearchSpace) -> optuna.Study:
        storage = self.storage_object()
        with self.asking():
            study = optuna.create_study(
                study_name=self.study_name,
                storage=storage,
                sampler=self.sampler_for(0),
                directions=self.directions,
                load_if_exists=True,
            )
            existing = [d.name.lower() for d in study.directions]
            if existing != self.directions:
                refuse(
                    f"hydra.sweeper.direction={self.directions} differs from study "
                    f"{self.study_name!r} in {self.storage} ({existing}): use its direction, "
                    "or another hydra.sweeper.study_name or storage"
                )
            described = space.description()
            recorded = study.user_attrs.get(SPACE)
            if recorded is None:
                study.set_user_attr(SPACE, described)
            elif recorded != described:
                changed = sorted(
                    k for k in set(recorded) | set(described) if recorded.get(k) != described.get(k)
                )
                refuse(
                    f"the overrides differ from those of study {self.study_name!r} in "
                    f"{self.storage} at {', '.join(changed)} (it has "
                    f"{[recorded.get(k) for k in changed]}, this command "
                    f"{[described.get(k) for k in changed]}): repeat the study's overrides to "
                    "resume it, or start another with hydra.sweeper.study_name or storage"
                )
        return study

    def check_fixed(self, space: SearchSpace) -> None:
        """A fixed override every trial would be refused for: one line, exit 2, before the study
        is stored (a searched value that a trial's run refuses fails that trial only)."""
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            return
        fixed = list(space.fixed.values())
        problem = job_problem(self, 0, fixed)
        searched = tuple(name.lstrip("+~") for name in space.distributions)
        if problem is not None and not (searched and problem.startswith(searched)):
            refuse(f"{problem} (every trial: {' '.join(fixed)}; no trial ran)")

    def interrupted(self, study: optuna.Study, numbers: list[int]) -> None:
        """Records trials ``numbers`` as failed and as interrupted (call while asking)."""
        if not numbers:
            return
        for number in numbers:
            study.tell(number, state=TrialState.FAIL, skip_if_finished=True)
        known = study.user_attrs.get(INTERRUPTED, [])
        study.set_user_attr(INTERRUPTED, sorted({*known, *numbers}))

    def recover(self, study: optuna.Study) -> None:
        """Records as interrupted every running trial whose process is gone."""
        gone = [
            trial.number
            for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if worker_is_gone(trial.user_attrs.get(WORKER))
        ]
        for number in gone:
            log.warning("trial %d: its process ended before its result; it runs again", number)
        self.interrupted(study, gone)

    def ask(self, study: optuna.Study, space: SearchSpace) -> list[Trial]:
        """Up to ``n_jobs`` new trials (interrupted ones first, with their parameters), so that
        the study holds at most ``n_trials`` trials that were not interrupted."""
        with self.asking():
            self.recover(study)
            trials = study.get_trials(deepcopy=False)
            interrupted = set(study.user_attrs.get(INTERRUPTED, []))
            counted = [t for t in trials if t.number not in interrupted]
            retried = {t.user_attrs.get(RETRY_OF) for t in trials}
            to_retry = [t for t in trials if t.number in interrupted and t.number not in retried]
            asked = []
            for index in range(len(counted), min(self.n_trials, len(counted) + self.n_jobs)):
                if to_retry:
                    again = to_retry.pop(0)
                    study.enqueue_trial(again.params, user_attrs={RETRY_OF: again.number})
                study.sampler = self.sampler_for(index)
                trial = study.ask(fixed_distributions=space.distributions)
                trial.set_user_attr(WORKER, worker_id())
                asked.append(trial)
            return asked

    def sweep(self, arguments: list[str]) -> list[JobReturn]:
        assert self.config is not None, "setup() comes first"
        try:
            space = search_space(self.params, arguments)
        except ConfigError as error:
            refuse(str(error))
        self.check_fixed(space)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = self.open_study(space)
        log.info(
            "Optuna study %r in %s: %s, sampler %s, %d trials",
            self.study_name,
            self.storage or "memory",
            "/".join(self.directions),
            self.sampler["_target_"],
            self.n_trials,
        )
        returns: list[JobReturn] = []
        while trials := self.ask(study, space):
            batch = self.launch(study, trials, space)
            returns += batch
            failed = self.tell(study, trials, batch)
            if failed / len(batch) > self.max_failure_rate:
                log.error(
                    "%d of %d trials failed (hydra.sweeper.max_failure_rate=%s)",
                    failed,
                    len(batch),
                    self.max_failure_rate,
                )
                for ret in batch:
                    _ = ret.return_value  # raises the first failed job's error
        self.write_results(study)
        return returns

    def launch(
        self, study: optuna.Study, trials: list[Trial], space: SearchSpace
    ) -> list[JobReturn]:
        """Runs the trials through the launcher, trial ``n`` as job ``n``; a trial left without
        its result by an exception here (Ctrl-C) is recorded as interrupted."""
        overrides = [tuple(space.overrides(trial.params)) for trial in trials]
        returns: list[JobReturn] = []
        try:
            start = 0
            while start < len(trials):
                end = start + 1
                while end < len(trials) and trials[end].number == trials[end - 1].number + 1:
                    end += 1
                returns += self.launcher.launch(
                    overrides[start:end], initial_job_idx=trials[start].number
                )
                start = end
        except BaseException:
            with self.asking():
                self.interrupted(study, [t.number for t in trials[len(returns) :]])
            raise
        return returns

    def tell(self, study: optuna.Study, trials: list[Trial], batch: list[JobReturn]) -> int:
        """Tells each trial's value (or failure); returns the number of failed trials."""
        failed = 0
        for trial, ret in zip(trials, batch):
            values = None
            if ret.status == JobStatus.COMPLETED:
                values = self._values(ret.return_value)
            if values is None:
                failed += 1
                why = "failed" if ret.status != JobStatus.COMPLETED else "returned no value"
                log.warning("trial %d %s: recorded as failed", trial.number, why)
                study.tell(trial, state=TrialState.FAIL)
            else:
                study.tell(trial, values)
        return failed

    def _values(self, value: Any) -> list[float] | None:
        """The job's return value as one float per direction, or None (not a finite number)."""
        raw = list(value) if isinstance(value, (list, tuple)) else [value]
        if len(raw) != len(self.directions):
            return None
        try:
            values = [float(v) for v in raw]
        except (TypeError, ValueError):
            return None
        return values if all(math.isfinite(v) for v in values) else None

    def write_results(self, study: optuna.Study) -> None:
        """``<sweep dir>/optimization_results.yaml``: the best trial (each Pareto-best one with
        several directions) and the count of trials per state."""
        trials = study.get_trials(deepcopy=False)
        states = {s.name.lower(): sum(t.state == s for t in trials) for s in TrialState}
        results: dict[str, Any] = {"name": "vfl_optuna", "study_name": self.study_name}
        complete = [t for t in trials if t.state == TrialState.COMPLETE]
        if len(self.directions) == 1:
            best: FrozenTrial | None = study.best_trial if complete else None
            results["best_params"] = best.params if best else None
            results["best_value"] = best.value if best else None
            results["best_trial"] = best.number if best else None
            log.info("best value %s with %s", results["best_value"], results["best_params"])
        else:
            results["solutions"] = [
                {"params": t.params, "values": t.values, "trial": t.number}
                for t in (study.best_trials if complete else [])
            ]
        results["trials"] = {k: v for k, v in states.items() if v}
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(OmegaConf.create(results), self.sweep_dir / "optimization_results.yaml")
