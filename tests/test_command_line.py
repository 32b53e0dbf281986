"""What a new user types wrong on the command line, as `python train.py ...` runs it: Hydra's own
errors (an option a group lacks, a key the config lacks, an override its grammar cannot read, a
config file YAML cannot read) and the refusals before training, each one `error:` line naming the
key, the value and the fix, exit code 2, in a run and in a multirun; HYDRA_FULL_ERROR=1 keeps
Hydra's own error."""

from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException, MissingConfigException

ROOT = Path(__file__).resolve().parents[1]
OPTIONS = "the options are"

CASES = [
    (["algo=foo"], rf"^algo=foo is not an option of algo: {OPTIONS} cascade, fedbcd, .*, zoo_vfl$"),
    (["data=foo"], rf"^data=foo is not an option of data: {OPTIONS} breast_cancer, .*synthetic$"),
    (["party=foo"], rf"^party=foo is not an option of party: {OPTIONS} cnn, fedbcd_cnn, mlp, pn"),
    (["head=foo"], rf"^head=foo is not an option of head: {OPTIONS} bias, credit_server, linear"),
    (
        ["optimizer=adamw"],
        rf"^optimizer=adamw is not an option of optimizer: did you mean optimizer=adam\? "
        rf"{OPTIONS} adam, sgd$",
    ),
    (["logger=foo"], rf"^logger=foo is not an option of logger: {OPTIONS} csv, none, wandb$"),
    (
        ["experiment=foo"],
        rf"^experiment=foo is not an option of experiment: {OPTIONS} .*cascade_digits, .*pbm_digits",
    ),
    (
        ["sed=3"],
        r"^sed is not a config key \(the root config takes algo, callbacks, .*seed.*\): did you "
        r"mean seed=3\?$",
    ),
    (
        ["algo=pbm", "mechanism.bta=0.1"],
        r"^mechanism.bta is not a config key \(mechanism=pbm takes C, apply_at_eval, b, beta, "
        r"seed\): did you mean mechanism.beta=0.1\?$",
    ),
    (
        ["algo=pbm", "mechanism.fusion=max"],
        r"^mechanism.fusion is not a config key \(mechanism=pbm takes C, apply_at_eval, b, beta, "
        r"seed\): mechanism=plain has it: choose it, or drop the override$",
    ),
    (["algo==pbm"], r"^algo==pbm has two '=': write algo=pbm$"),
    (
        ["data.columns=[[0,1]"],
        r"^data.columns=\[\[0,1\] opens 2 '\[' but closes 1 '\]': close every bracket \(a list "
        r"of lists: data.columns=\[\[0,1\],\[2,3\]\]\)$",
    ),
    (
        ["data.bätch_size=8"],
        r"^data.bätch_size=8: the key data.bätch_size has 'ä', and keys are ASCII names: did you "
        r"mean data.batch_size\? check the key's spelling$",
    ),
    (
        ["algo._target_=nonexistent.Module"],
        r"^algo._target_=nonexistent.Module cannot be imported: there is no module named "
        r"'nonexistent': check the spelling, or install the package that provides it",
    ),
    (
        ["algo._target_=os.system"],
        r"^algo._target_=os.system is a builtin_function_or_method, not a protocol \(a subclass "
        r"of vfl_lightning.algorithms.base.VFLModule, e.g. vfl_lightning.algorithms.SyncVFL\): "
        r"name your protocol class there, or choose a shipped one with algo=NAME$",
    ),
    (
        ["algo._target_=os.nope"],
        r"^algo._target_=os.nope cannot be imported \(module 'os' has no attribute 'nope'\)",
    ),
    (
        ["optimized_metric=val/nonexistent"],
        r"^optimized_metric=val/nonexistent is not a metric runs log \(val/ has val/acc, .*\): "
        r"choose one of them$",
    ),
    (
        ["a" * 5000 + "=1"],
        r"^a{40}\.\.\. \(5000 characters\) is not a config key \(looking it up failed: File name "
        r"too long\): check the override's key",
    ),
    (
        ["+seed=3"],
        r"^\+seed=3 adds seed, which the config already has: write seed=3 \(or \+\+seed=3 to add "
        r"or override\)$",
    ),
    (["~sed"], r"^~sed removes sed, which the config does not have: did you mean ~seed\? "),
    (["hydra/launcher=foo"], rf"^hydra/launcher=foo is not an option of hydra/launcher: {OPTIONS}"),
    # a list where a number goes: refused, and results.json still written (a ListConfig)
    (["seed=[1,2]"], r"^seed must be an integer in \[0, 2\^32 - 1\], got \[1, 2\]$"),
    (
        ["attack=[feature_reconstruction,foo]"],
        rf"^attack=foo is not an option of attack: {OPTIONS} direction_scoring, "
        r"feature_reconstruction, label_inference",
    ),
    (
        ["target.value=2"],
        r"^target.value=2 can never be reached by target.metric=val/acc, which lies in \[0, 1\]: "
        r"choose a value in \[0, 1\]$",
    ),
    # an option the dataset's loader does not take: named as data.options.<key>, not data.<key>
    (
        ["+data.options.foo=1"],
        r"^data.options.foo is not an option of the digits dataset's loader: drop it with "
        r"~data.options.foo$",
    ),
    (
        ["target.stop=true"],
        r"^target.stop=true ends training when target.metric=val/acc reaches target.value, but "
        r"target.value is null, so it would never stop: set target.value \(e.g. "
        r"target.value=0.9\), or target.stop=false$",
    ),
    (
        ["data.partition=explicit", "data.columns=5"],
        r"^data.columns must be null or one list of column indices >= 0 per party, e.g. "
        r"\[\[0,1\],\[2,3\]\], got 5$",
    ),
    (
        ["data.partition=explicit", "data.columns=[[0,1],[2,3]]"],
        r"^data.columns lists 2 column lists, but data.num_parties=4: give one list per party, "
        r"or set data.num_parties=2$",
    ),
]


def run_cli(argv: list[str], monkeypatch, capsys) -> tuple[int | str | None, list[str]]:
    """``python train.py <argv>`` in this process: its exit code and its stderr lines."""
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])
    try:
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()
    return stop.value.code, capsys.readouterr().err.splitlines()


@pytest.fixture
def new_user(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    return tmp_path


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[" ".join(c[0])[:40] for c in CASES])
def test_a_bad_input_is_one_line_and_exit_2(new_user, monkeypatch, capsys, overrides, message):
    argv = ["logger=none", f"hydra.run.dir={new_user / 'run'}", *overrides]
    code, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    assert re.search(message, err[0][len("error: ") :]), err[0]
    assert not list(new_user.rglob("checkpoints")), "nothing trains"


def test_a_run_dir_outside_ascii_names_the_quoted_form_that_works(new_user, monkeypatch, capsys):
    folder = new_user / "rün"
    code, err = run_cli([f"hydra.run.dir={folder}", "seed=-1"], monkeypatch, capsys)
    assert code == 2
    assert err == [
        f"error: hydra.run.dir={folder}: a value with characters outside ASCII must be quoted: "
        f"write hydra.run.dir='{folder}' (in a shell: \"hydra.run.dir='{folder}'\")"
    ]
    code, err = run_cli([f"hydra.run.dir='{folder}'", "seed=-1"], monkeypatch, capsys)
    assert (code, err[-1]) == (2, "error: seed must be an integer in [0, 2^32 - 1], got -1")
    assert json.loads((folder / "results.json").read_text())["status"] == "failed"


def test_a_tab_in_a_config_on_the_search_path_names_the_file_and_line(
    new_user, monkeypatch, capsys
):
    (new_user / "mine" / "algo").mkdir(parents=True)
    (new_user / "mine" / "algo" / "tabby.yaml").write_text("name: tabby\n\t_target_: x\n")
    argv = [f"hydra.searchpath=[file://{new_user / 'mine'}]", "algo=tabby"]
    code, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2
    assert err == [
        f"error: {new_user / 'mine' / 'algo' / 'tabby.yaml'}, line 2, column 1 (chosen by "
        "algo=tabby): found character '\\t' that cannot start any token: indent with spaces: "
        "YAML does not allow a tab there"
    ]


def test_a_refused_run_writes_results_json_and_its_log(new_user, monkeypatch, capsys):
    code, err = run_cli(["optimizer.lr=-1", f"hydra.run.dir={new_user}"], monkeypatch, capsys)
    assert (code, err) == (2, ["error: optimizer.lr must be a finite number >= 0, got -1"])
    results = json.loads((new_user / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == err[0][len("error: ") :]
    assert err[0][len("error: ") :] in (new_user / "train.log").read_text()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=foo,pbm"], r"^error: algo=foo is not an option of algo: the options are"),
        (["seed=0,1", "sed=3"], r"^error: sed is not a config key .*did you mean seed=3\?$"),
        (["seed=0,1", "data.columns=[[0,1]"], r"^error: data.columns=\[\[0,1\] opens 2 '\['"),
        # a bad value in the middle of a list: every job's keys and values before the first job
        (
            ["data.batch_size=32,-1,64"],
            r"^error: data.batch_size must be an integer >= 1, got -1 \(job 1 of the sweep: "
            r"data.batch_size=-1 logger=none; no job ran\)$",
        ),
        (
            ["seed=0,1", "optimized_metric=val/nope,val/acc"],
            r"^error: optimized_metric=val/nope is not a metric runs log .*\(job 0 of the sweep: "
            r"seed=0 optimized_metric=val/nope logger=none; no job ran\)$",
        ),
        # an Optuna study's fixed override that every trial would be refused for
        (
            ["experiment=pbm_search", "optimizer.lr=-1", "hydra.sweeper.n_trials=2"],
            r"^error: optimizer.lr must be a finite number >= 0, got -1 \(every trial: "
            r"optimizer.lr=-1 experiment=pbm_search logger=none; no trial ran\)$",
        ),
        # n_jobs=0 has no meaning to joblib
        (
            ["hydra/launcher=joblib", "hydra.launcher.n_jobs=0", "seed=0,1"],
            r"^error: hydra.launcher.n_jobs must be a nonzero integer \(jobs at a time; -1: one "
            r"per core\), got 0$",
        ),
    ],
)
def test_a_multirun_is_refused_before_any_job(new_user, monkeypatch, capsys, overrides, message):
    argv = ["-m", *overrides, "logger=none", f"hydra.sweep.dir={new_user / 'sweep'}"]
    code, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2 and len(err) == 1, err
    assert re.search(message, err[0]), err[0]
    assert not list(new_user.rglob("results.json")), "no job ran"


def test_a_refused_job_of_a_multirun_exits_2_and_the_sweep_goes_on(new_user, monkeypatch, capsys):
    """A refusal that only the job's own run finds (the PBM accountant's limit, after the
    imports) fails that job; the sweep goes on."""
    argv = [
        "-m",
        "algo=pbm",
        "mechanism.b=2000,16",
        "debug=fdr",
        "logger=none",
        f"hydra.sweep.dir={new_user}",
    ]
    code, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2
    line = "error: num_parties * b = 8000 is too large for the exact PBM accountant"
    assert [e for e in err if e.startswith("error:")] == [err[-1]] * 2  # the job's, the sweep's
    assert err[-1].startswith(line)
    statuses = {
        p.parent.name: json.loads(p.read_text())["status"] for p in new_user.rglob("*.json")
    }
    assert statuses == {"0": "failed", "1": "finished"}


@pytest.mark.parametrize(
    ("overrides", "error"),
    [(["algo=foo"], MissingConfigException), (["sed=3"], ConfigCompositionException)],
)
def test_hydra_full_error_keeps_hydras_own_error(new_user, monkeypatch, overrides, error):
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setattr(sys, "argv", ["train.py", f"hydra.run.dir={new_user}", *overrides])
    try:
        with pytest.raises(error):
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()


def test_a_config_error_is_answered_before_torch_and_lightning_are_imported(tmp_path):
    """``python train.py`` with an unknown key, a wrong type, a value out of range, an unknown
    option, a protocol from the standard library, and ``--help``: the answer comes before torch
    or Lightning is imported."""
    script = (
        "import runpy, sys\n"
        "sys.argv = ['train.py', *sys.argv[1:]]\n"
        "try:\n"
        f"    runpy.run_path({str(ROOT / 'train.py')!r}, run_name='__main__')\n"
        "except SystemExit as stop:\n"
        "    heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning'})\n"
        "    print('exit', stop.code, heavy)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    for overrides in (
        ["+data.bach_size=8"],
        ["data.batch_size=abc"],
        ["optimizer.lr=-1"],
        ["algo=foo"],
        ["algo._target_=os.system"],
        ["--help"],
    ):
        done = subprocess.run(
            [sys.executable, "-c", script, f"hydra.run.dir={tmp_path}", *overrides],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=120,
        )
        code = 0 if overrides == ["--help"] else 2
        assert done.stdout.splitlines()[-1] == f"exit {code} []", (overrides, done.stderr[-500:])


def test_help_lists_what_hydras_own_help_lists(new_user, monkeypatch, capsys):
    """``--help`` reads the config repository once; its text is Hydra's own."""
    from conftest import run_train_py

    monkeypatch.setattr(sys, "argv", ["train.py", "--help"])
    try:
        with pytest.raises(SystemExit) as stop:
            runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:
        GlobalHydra.instance().clear()
    ours = capsys.readouterr().out
    with pytest.raises(SystemExit):
        run_train_py(["--help"])
    hydras = capsys.readouterr().out
    assert stop.value.code == 0
    # the first line names the app: train (the root train.py) or cli (the test's task function)
    assert ours.splitlines()[1:] == hydras.splitlines()[1:]
    assert "algo: cascade, fedbcd," in ours and "\ndebug: fdr, limit\n" in ours


@pytest.mark.parametrize(
    ("party_dir", "reason"),
    [
        ("/proc/x/parties", r"\[Errno 2\] No such file or directory: '/proc/x'"),
        ("/etc/hostname/parties", r"\[Errno 20\] Not a directory: '/etc/hostname/parties'"),
    ],
)
def test_a_party_dir_that_cannot_be_made_is_refused_before_ray_starts(
    make_cfg, monkeypatch, party_dir, reason
):
    from vfl_lightning.run import ray_session
    from vfl_lightning.train import train

    def start_ray(cfg):
        raise AssertionError("Ray started")

    monkeypatch.setattr(ray_session, "start_ray", start_ray)
    cfg = make_cfg("algo=npq", "runtime=ray", f"runtime.party_dir={party_dir}")
    with pytest.raises(
        Exception, match=rf"^runtime.party_dir={party_dir} cannot be used: {reason};"
    ):
        train(cfg)


def test_checking_a_party_dir_leaves_nothing_behind(tmp_path):
    from vfl_lightning.run.checks import unwritable

    assert unwritable(tmp_path / "a" / "b" / "c") is None
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("")
    assert unwritable(tmp_path / "file") == f"{tmp_path / 'file'} is a file, not a directory"


@pytest.mark.parametrize(("round", "checkpoint"), [(0, None), (6, "/runs/a/checkpoints/last.ckpt")])
def test_a_party_that_fails_to_start_names_the_cause_and_no_checkpoint(round, checkpoint):
    from types import SimpleNamespace

    from ray.exceptions import RayActorError

    from vfl_lightning.runtime.ray_parties import RayParties

    died = RayActorError(
        error_msg="The actor died because of an error raised in its creation task\n"
        "Traceback (most recent call last):\n  ...\n"
        "PermissionError: [Errno 13] Permission denied: '/srv/parties/party_0'",
        actor_init_failed=True,
    )
    parties = SimpleNamespace(round_fn=lambda: round, checkpoint_fn=lambda: checkpoint)
    line = str(RayParties.lost(parties, 0, "key setup", died))
    assert line.startswith(
        f"party 0's Ray actor died at training round {round} (key setup): it failed to start "
        "(PermissionError: [Errno 13] Permission denied: '/srv/parties/party_0')"
    )
    assert ("ckpt_path=" in line) is (checkpoint is not None)
    assert line.endswith(
        f"resume with ckpt_path={checkpoint}"
        if checkpoint
        else "the run stopped before training: run the same command again"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--bogus"], "error: unrecognized arguments: --bogus (see --help)"),
        (["--info", "nope"], "error: argument --info/-i: invalid choice: 'nope' (choose from "),
    ],
)
def test_a_flag_hydra_does_not_take_is_one_line(new_user, monkeypatch, capsys, argv, line):
    """Before: Hydra's usage (several lines), then ``train.py: error: ...``."""
    code, err = run_cli(argv, monkeypatch, capsys)
    assert code == 2 and len(err) == 1 and err[0].startswith(line), err
