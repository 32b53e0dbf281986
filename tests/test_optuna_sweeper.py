"""hydra/sweeper=vfl_optuna on Optuna's ask-and-tell API: the search space read from Hydra
overrides, settings refused in one line, a study kept in its journal file that resumes after its
process dies (kill -9) without running a finished trial again, and processes sharing one study
(the joblib launcher's, or two commands) without repeating a trial."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import QUIET, stop_at
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState
from test_report import run_multirun

from vfl_lightning.errors import ConfigError
from vfl_lightning.sweep.optuna_study import (
    INTERRUPTED,
    RETRY_OF,
    WORKER,
    OptunaStudySweeper,
    trial_seed,
)
from vfl_lightning.sweep.space import search_space

ROOT = Path(__file__).resolve().parents[1]
TRIAL = [
    "experiment=pbm_search",
    "trainer.max_epochs=1",
    "trainer.limit_train_batches=3",
    "trainer.limit_val_batches=2",
    "test=false",
    "callbacks.checkpoint=null",
]


def study_of(sweep: Path, name: str = "pbm_search") -> optuna.Study:
    storage = JournalStorage(JournalFileBackend(str(sweep / "optuna.journal")))
    return optuna.load_study(study_name=name, storage=storage)


def params_by_trial(study: optuna.Study) -> list[dict]:
    """The parameters of the study's trials that were not interrupted, in trial order."""
    interrupted = set(study.user_attrs.get(INTERRUPTED, []))
    return [t.params for t in study.get_trials() if t.number not in interrupted]


def values_by_trial(study: optuna.Study) -> list[float]:
    return [t.value for t in study.get_trials() if t.state == TrialState.COMPLETE]


def test_overrides_become_optuna_distributions():
    space = search_space(
        {"optimizer.lr": "tag(log, interval(0.003, 0.3))", "mechanism.beta": "interval(0.02,0.25)"},
        [
            "mechanism.beta=choice(0.1,0.2)",
            "+algo.q=range(1,7,2)",
            "data.partition='a b'",
            "x=range(0.5,1.0,0.25)",
        ],
    )
    assert space.distributions == {
        "optimizer.lr": FloatDistribution(0.003, 0.3, log=True),
        "mechanism.beta": CategoricalDistribution([0.1, 0.2]),
        "+algo.q": IntDistribution(1, 5, step=2),
        "x": CategoricalDistribution([0.5, 0.75]),
    }
    assert space.fixed == {"data.partition": "data.partition='a b'"}
    assert space.overrides(
        {"optimizer.lr": 0.01, "mechanism.beta": 0.2, "+algo.q": 3, "x": 0.5}
    ) == [
        "optimizer.lr=0.01",
        "mechanism.beta=0.2",
        "+algo.q=3",
        "x=0.5",
        "data.partition='a b'",
    ]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("a=tag(lg,interval(1,2))", "unknown tag"),
        ("a=tag(log,interval(0,2))", "needs a > 0"),
        ("a=interval(2,1)", "needs a < b"),
        ("a=tag(log,choice(1,2))", "the log tag applies to interval"),
        ("a=choice([1,2],[3])", None),
        ("a=choice(1,1)", "a value appears twice"),
        ("a=interval(1", "is not a Hydra override"),
    ],
)
def test_search_dimensions_optuna_cannot_take_are_refused(override, message):
    if message is None:  # lists are passed as their text, one category each
        assert search_space(None, [override]).distributions["a"] == CategoricalDistribution(
            ["[1,2]", "[3]"]
        )
        return
    with pytest.raises(ConfigError, match=message):
        search_space(None, [override])


SETTINGS = dict(
    sampler={"_target_": "optuna.samplers.TPESampler", "seed": 0},
    direction="maximize",
    storage=None,
    study_name="s",
    n_trials=2,
    n_jobs=1,
    max_failure_rate=1.0,
    params=None,
)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_trial": 3}, "hydra.sweeper.n_trial is not a setting of hydra/sweeper=vfl_optuna"),
        ({"n_trials": 0}, "hydra.sweeper.n_trials=0 must be an integer >= 1"),
        ({"n_jobs": 1.5}, "hydra.sweeper.n_jobs=1.5 must be an integer >= 1"),
        ({"direction": "max"}, "hydra.sweeper.direction=max must be minimize, maximize"),
        ({"max_failure_rate": 2}, "hydra.sweeper.max_failure_rate=2 must be a number in"),
        ({"study_name": ""}, "hydra.sweeper.study_name= must be a non-empty name"),
        ({"sampler": {"seed": 0}}, "must name an Optuna sampler"),
        ({"params": ["a=1"]}, "hydra.sweeper.params=['a=1'] must be a mapping"),
        (
            {"sampler": {"_target_": "optuna.samplers.TPESampler", "seed": "abc"}},
            "hydra.sweeper.sampler.seed=abc must be an integer >= 0 or null",
        ),
    ],
)
def test_bad_settings_are_one_line(capsys, change, message):
    with pytest.raises(SystemExit) as exit_info:
        OptunaStudySweeper(**{**SETTINGS, **change})
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_a_study_refuses_other_overrides_or_direction(tmp_path, capsys):
    """A command joining a study (resume, or a second worker) must search the same space with
    the same fixed overrides and direction."""
    storage = {**SETTINGS, "storage": str(tmp_path / "optuna.journal")}
    arguments = ["a=interval(0,1)", "b=1"]
    OptunaStudySweeper(**storage).open_study(search_space(None, arguments))
    OptunaStudySweeper(**storage).open_study(search_space(None, list(reversed(arguments))))
    for settings, other, message in [
        (storage, ["a=interval(0,2)", "b=1"], "the overrides differ from those of study 's'"),
        (storage, [*arguments, "c=2"], "at c (it has [None], this command ['c=2'])"),
        ({**storage, "direction": "minimize"}, arguments, "direction=['minimize'] differs"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            OptunaStudySweeper(**settings).open_study(search_space(None, other))
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


def dead_worker() -> str:
    """A worker id (host pid start) of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return f"{socket.gethostname()} {proc.pid} 1"


def test_a_trial_whose_process_died_runs_again_and_the_study_continues(tmp_path):
    """Two trials finished, a third left running by a dead process: the next command records it
    as interrupted, runs its parameters again, and ends with the same trials and values as a
    study that was never interrupted (each trial's sampler seed is derived from its index)."""
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    run_multirun([*TRIAL, "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={whole}"])
    run_multirun([*TRIAL, "hydra.sweeper.n_trials=2", f"hydra.sweep.dir={broken}"])
    study = study_of(broken)
    space = study.get_trials()[0].distributions
    study.sampler = optuna.samplers.TPESampler(seed=trial_seed(0, 2))
    lost = study.ask(fixed_distributions=space)
    lost.set_user_attr(WORKER, dead_worker())
    finished = {n: (broken / str(n) / "results.json").stat().st_mtime_ns for n in (0, 1)}

    run_multirun([*TRIAL, "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={broken}"])

    study = study_of(broken)
    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 2 + [TrialState.FAIL] + [
        TrialState.COMPLETE
    ] * 2
    assert study.user_attrs[INTERRUPTED] == [2]
    assert trials[3].user_attrs[RETRY_OF] == 2 and trials[3].params == trials[2].params
    assert {n: (broken / str(n) / "results.json").stat().st_mtime_ns for n in (0, 1)} == finished
    assert not (broken / "2").exists() and (broken / "4" / "results.json").exists()
    assert params_by_trial(study) == params_by_trial(study_of(whole))
    assert values_by_trial(study) == values_by_trial(study_of(whole))
    best = yaml.safe_load((broken / "optimization_results.yaml").read_text())
    assert best["trials"] == {"complete": 4, "fail": 1}


@pytest.mark.slow
def test_joblib_processes_share_one_study_without_repeating_a_trial(tmp_path):
    """hydra/launcher=joblib with two trials asked at a time: every trial runs once, in a
    joblib worker process, and the study holds exactly n_trials distinct trials."""
    sweep = tmp_path / "study"
    run_multirun(
        [
            *TRIAL,
            "hydra/launcher=joblib",
            "hydra.launcher.n_jobs=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.n_trials=4",
            "+callbacks.pid._target_=conftest.WritePid",
            f"hydra.sweep.dir={sweep}",
        ]
    )
    study = study_of(sweep)
    assert [t.number for t in study.get_trials()] == [0, 1, 2, 3]
    assert all(t.state == TrialState.COMPLETE for t in study.get_trials())
    params = params_by_trial(study)
    assert len({json.dumps(p, sort_keys=True) for p in params}) == 4
    pids = {int((sweep / str(n) / "pid").read_text()) for n in range(4)}
    assert os.getpid() not in pids
    for n, trial in enumerate(study.get_trials()):
        overrides = yaml.safe_load((sweep / str(n) / ".hydra" / "overrides.yaml").read_text())
        assert f"optimizer.lr={trial.params['optimizer.lr']!r}" in overrides


def train_py(sweep: Path, *overrides: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]),
    }
    command = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        *[q for q in QUIET if not q.startswith("logger=")],  # as run_multirun's
        *TRIAL,
        f"hydra.sweep.dir={sweep}",
        *overrides,
    ]
    return subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


@pytest.mark.slow
def test_a_study_killed_with_kill_9_resumes_where_it_stopped(tmp_path):
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    kill = stop_at(0, 1, how="kill", job=2)
    proc = train_py(killed, "hydra.sweeper.n_trials=4", *kill)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == -signal.SIGKILL, output
    study = study_of(killed)
    assert [t.state for t in study.get_trials()] == [TrialState.COMPLETE] * 2 + [TrialState.RUNNING]
    finished = {n: (killed / str(n) / "results.json").stat().st_mtime_ns for n in (0, 1)}

    run_multirun([*TRIAL, "hydra.sweeper.n_trials=4", *kill, f"hydra.sweep.dir={killed}"])
    run_multirun([*TRIAL, "hydra.sweeper.n_trials=4", f"hydra.sweep.dir={whole}"])

    study = study_of(killed)
    assert study.user_attrs[INTERRUPTED] == [2]
    assert [t.state for t in study.get_trials()].count(TrialState.COMPLETE) == 4
    assert {n: (killed / str(n) / "results.json").stat().st_mtime_ns for n in (0, 1)} == finished
    assert params_by_trial(study) == params_by_trial(study_of(whole))
    assert values_by_trial(study) == values_by_trial(study_of(whole))


@pytest.mark.slow
def test_two_commands_share_one_study_without_repeating_a_trial(tmp_path):
    sweep = tmp_path / "shared"
    extra = ["hydra.sweeper.n_trials=6", "trainer.limit_train_batches=6"]
    workers = [train_py(sweep, *extra) for _ in range(2)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], outputs
    study = study_of(sweep)
    trials = study.get_trials()
    assert [t.number for t in trials] == list(range(6))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    assert len({json.dumps(t.params, sort_keys=True) for t in trials}) == 6
    assert {t.user_attrs[WORKER].split()[1] for t in trials} == {str(w.pid) for w in workers}
    for n in range(6):
        assert (sweep / str(n) / "results.json").exists()
    launched = [line for out in outputs for line in out.splitlines() if "\t#" in line]
    assert len(launched) == 6, launched
