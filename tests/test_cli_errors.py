"""Every bad configuration ends in one line `error: ...` (exit 2) from the CLI, a stated run
failure in one line (exit 1), and HYDRA_FULL_ERROR=1 still shows the traceback."""

import io
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import CONF_DIR
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import get_class, instantiate
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch.strategies.launchers import subprocess_script
from omegaconf import OmegaConf

from vfl_lightning import cli
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.config_checks import check_data_parallel
from vfl_lightning.run.outcome import error_summary, exit_code
from vfl_lightning.run.schema import check_schema, check_training_batches
from vfl_lightning.train import train

ROOT = Path(CONF_DIR).parent
FAST = ["trainer.max_steps=2", "trainer.limit_val_batches=1", "test=false"]
FEDVS = ["experiment=fedvs_digits"]

BATTERY = [
    (
        [*FEDVS, "party=mlp"],
        r"^algo=fedvs needs polynomial-network parties \(party=pn\), got MLPEncoder$",
    ),
    (
        ["attack=label_inference", "algo=pbm"],
        r"^mechanism=pbm has no option mechanism.fusion, which the chosen configs set "
        r"\(algo=pbm, attack=label_inference\)",
    ),
    (
        ["algo=pbm", "mechanism.b=1000000000000"],
        r"num_parties \* b = 4000000000000 is too large for the exact PBM accountant \(at most "
        r"4096.*lower mechanism.b to at most 1024$",
    ),
    (
        ["algo=pbm", "mechanism.beta=0.3"],
        r"^mechanism.beta must be in \(0, 0.25\] for PBM, got 0.3$",
    ),
    (
        ["algo=pbm", "mechanism.beta=0"],
        r"^mechanism.beta must be in \(0, 0.25\] for PBM, got 0: beta = 0",
    ),
    (["algo=pbm", "mechanism.b=0"], r"^mechanism.b must be an integer >= 1, got 0$"),
    (["algo=pbm", "mechanism.b=abc"], r"^mechanism.b must be an integer >= 1, got 'abc'$"),
    (
        ["algo=pbm", "mechanism.beta=abc"],
        r"^mechanism.beta must be a number in \(0, 0.25\] for PBM, got 'abc'$",
    ),
    (
        ["algo=ldp", "mechanism.sigma=abc"],
        r"^mechanism.sigma must be a finite number > 0 or null, got 'abc'$",
    ),
    (["algo=ldp", "mechanism.sigma=0"], r"^mechanism.sigma must be a finite number > 0 or null"),
    (["seed=-1"], r"^seed must be an integer in \[0, 2\^32 - 1\], got -1$"),
    (["seed=abc"], r"^seed must be an integer in \[0, 2\^32 - 1\], got 'abc'$"),
    (["seed=1.5"], r"^seed must be an integer in \[0, 2\^32 - 1\], got 1.5$"),
    (["torch_threads=-1"], r"^torch_threads must be an integer >= 1 or null, got -1$"),
    (["torch_threads=abc"], r"^torch_threads must be an integer >= 1 or null, got 'abc'$"),
    # 100,000 threads would exhaust memory while the data loads
    (
        ["torch_threads=100000"],
        rf"^torch_threads=100000 is more than 4 threads per core of this machine's "
        rf"{os.cpu_count()}: choose at most {4 * os.cpu_count()} \(null: torch's default\)$",
    ),
    (["lightning_speedups=maybe"], r"^lightning_speedups must be true or false, got 'maybe'$"),
    (
        ["trainer.precision=16-mixed"],
        r"^trainer.precision must be one of .*got '16-mixed' \(float16 AMP scales the loss",
    ),
    (
        ["trainer.precision=17"],
        r"^trainer.precision must be one of \('32-true', '64-true', 'bf16-mixed', 'bf16-true'\) "
        r"\(or 32, 64, bf16\), got 17$",
    ),
    (["trainer.accelerator=tpu"], r"^trainer.accelerator must be one of \('auto', .*got 'tpu'$"),
    (["optimizer.lr=-1"], r"^optimizer.lr must be a finite number >= 0, got -1$"),
    (["optimizer.lr=abc"], r"^optimizer.lr must be a finite number >= 0, got 'abc'$"),
    # a sweeper would get no value
    (
        ["test=false", "optimized_metric=test/acc"],
        r"^test=false runs no test split, but optimized_metric=test/acc needs one: set test=true, "
        r"or choose a val/ metric$",
    ),
    # beyond float32, which torch's update cannot take
    (
        ["optimizer.lr=1e308"],
        r"^optimizer.lr=1e\+308 is beyond float32's largest value \(3.403e\+38\), which the "
        r"parameters' update cannot take: choose a smaller value$",
    ),
    (["algo=cascade", "algo.server_lr=1e300"], r"^algo.server_lr=1e\+300 is beyond float32's"),
    (["optimizer.momentum=-0.5"], r"^optimizer.momentum must be a number in \[0, 1\), got -0.5$"),
    (
        ["optimizer=adam", "+optimizer.betas=[0.9,1.5]"],
        r"^optimizer.betas must be two numbers in \[0, 1\), got \[0.9, 1.5\]$",
    ),
    (
        ["+optimizer.nesterov=true", "optimizer.momentum=0"],
        r"^optimizer.nesterov=true needs optimizer.momentum > 0 and optimizer.dampening=0",
    ),
    ([*FEDVS, "algo.T=0"], r"^algo.T must be an integer >= 1, got 0: with T = 0"),
    (
        [*FEDVS, "algo.T=8"],
        r"^FedVS needs N >= 2\(K\+T-1\)\+1 = 17 clients for K=1, T=8, got N=8; algo.T must be "
        r"at most 3 with N=8 and algo.K=1$",
    ),
    # the FedVS wrap-around pre-check runs in on_train_start, inside Lightning's fit
    ([*FEDVS, "algo.l_x=20"], r"^FedVS decoded sums can reach \d+ .*lower algo.l_x from 20 to"),
    (["trainer.max_epochs=-5"], r"^trainer.max_epochs must be an integer >= 1 \(or -1 with "),
    (
        ["trainer.limit_train_batches=0"],
        r"^trainer.limit_train_batches=0 trains nothing: set ckpt_path to evaluate a checkpoint",
    ),
    (["trainer.limit_train_batches=0.0"], r"^trainer.limit_train_batches=0.0 trains nothing"),
    (["data.batch_size=0"], r"^data.batch_size must be an integer >= 1, got 0$"),
    (["data.val_fraction=1.5"], r"^data.val_fraction must be a number in \[0, 1\), got 1.5$"),
    (["party.embedding_dim=0"], r"^party.embedding_dim must be an integer >= 1, got 0$"),
    (["party.embedding_dim=-3"], r"^party.embedding_dim must be an integer >= 1, got -3$"),
    (["party.hidden=[-3]"], r"^party.hidden must be a list of integers >= 1, got \[-3\]$"),
    (["party.hidden=64"], r"^party.hidden must be a list of integers >= 1, got 64$"),
    (
        ["head=mlp", "head.hidden=[8,-3]"],
        r"^head.hidden must be a list of integers >= 1, got \[8, -3\]$",
    ),
    (
        ["party=cnn", "party.channels=[16,-1]"],
        r"^party.channels must be a list of integers >= 1, got \[16, -1\]$",
    ),
    (
        ["data.val_fraction=0"],
        r"^data.val_fraction=0 leaves no validation split, but optimized_metric=val/acc needs one: "
        r"set data.val_fraction in \(0, 1\)",
    ),
    (
        ["data.val_fraction=0", "optimized_metric=null", "target.value=0.9"],
        r"^data.val_fraction=0 leaves no validation split, but target.metric=val/acc needs one",
    ),
    (
        ["mechanism.fusion=prod"],
        r"^fusion must be one of \('sum', 'mean', 'concat', 'max'\), got 'prod'$",
    ),
    (
        ["callbacks.checkpoint.every_n_train_steps=0"],
        r"^callbacks.checkpoint.every_n_train_steps must be an integer >= 1 or null, got 0$",
    ),
    (["data=mnist", "paths.data_dir=/etc/hostname/cache"], r"^paths.data_dir=/etc/hostname/cache"),
    (["ckpt_path=/nonexistent/last.ckpt"], r"^ckpt_path=/nonexistent/last.ckpt does not exist"),
    # refused in the attack callback's setup, inside fit before the first batch
    (["attack=label_inference", "attack.party=9"], r"^attack.party must be in \[0, 3\], got 9$"),
]


BEFORE_FIT = [
    (
        ["algo=pbm", "mechanism.b=2000"],
        r"^num_parties \* b = 8000 is too large for the exact PBM accountant .*lower mechanism.b "
        r"to at most 1024$",
    ),
    (["target.value=abc"], r"^target.value must be a finite number or null, got 'abc'$"),
    (["target.mode=maximum"], r"^target.mode must be one of \('max', 'min'\), got 'maximum'$"),
    (
        ["runtime=ray", "runtime.exchange=fast"],
        r"^runtime.exchange must be one of \('tasks', 'compiled'\), got 'fast'$",
    ),
    (["data.eval_batch_size=0"], r"^data.eval_batch_size must be an integer >= 1, got 0$"),
    (
        ["trainer.max_epochs=abc"],
        r"^trainer.max_epochs must be an integer >= 1 \(or -1 with trainer.max_steps >= 1, which "
        r"then ends training\), got 'abc' with trainer.max_steps=-1$",
    ),
    (
        ["trainer.max_epochs=-1"],
        r"^trainer.max_epochs must be an integer >= 1 .*got -1 with trainer.max_steps=-1$",
    ),
    (["data.binary=maybe"], r"^data.binary must be true or false, got 'maybe'$"),
    (["optimizer.momentum=1.5"], r"^optimizer.momentum must be a number in \[0, 1\), got 1.5$"),
    (
        ["+foo=1"],
        r"^foo is not a config key \(the root config takes algo, attack, audit, callbacks, .*\); check "
        r"the spelling of 'foo', or drop the override$",
    ),
    (
        ["+data.bach_size=8"],
        r"^data.bach_size is not a config key \(data \(vfl_lightning.data.VerticalDataModule\) "
        r"takes active_party, batch_size, .*\); check the spelling of 'bach_size'",
    ),
    # a runtime takes its SETTINGS only
    (
        ["+runtime.foo=1"],
        r"^runtime.foo is not a config key \(runtime=local takes name, party_seeds\); check the "
        r"spelling of 'foo', or drop the override$",
    ),
    (
        ["runtime=ray", "+runtime.foo=1"],
        r"^runtime.foo is not a config key \(runtime=ray takes address, exchange, known_parties, "
        r"name, num_cpus, party_dir, party_resources, party_seeds, time_scale\); check the ",
    ),
    # a node without _target_ is checked at every depth
    (
        ["audit=canary", "+audit.canary.foo=1"],
        r"^audit.canary.foo is not a config key \(audit.canary takes confidence, count, known, "
        r"party\); check the spelling of 'foo'",
    ),
    # W&B's logger passes what Lightning's does not take to wandb.init: its keys are checked
    (
        ["logger=wandb", "+logger.wandb.foo=1"],
        r"^logger.wandb.foo is not a config key \(logger.wandb \(vfl_lightning.loggers."
        r"WandbLogger\) takes .*entity, .*notes, .*project.*\); check the spelling of 'foo'",
    ),
    (
        ["+target.foo=1"],
        r"^target.foo is not a config key \(target takes metric, mode, stop, value\)",
    ),
    (
        ["+callbacks.extra.every=1"],
        r"^callbacks.extra needs a _target_ \(the class to instantiate\), got keys \['every'\]",
    ),
    (["data.batch_size=1.5"], r"^data.batch_size must be an integer >= 1, got 1.5$"),
    (["data.batch_size=abc"], r"^data.batch_size must be an integer >= 1, got 'abc'$"),
    (
        ["data=party_files"],
        r"^data.dir must be set \(the config leaves it \?\?\?\): the directory written by "
        r"python -m vfl_lightning.data.export \(data=party_files data.dir=DIR\)$",
    ),
    (
        ["trainer.log_every_n_steps=0"],
        r"^trainer.log_every_n_steps must be an integer >= 1, got 0$",
    ),
    (
        ["trainer.limit_val_batches=1.5"],
        r"^trainer.limit_val_batches must be null, an integer >= 0 \(batches\) or a float in "
        r"\[0, 1\] \(a fraction\), got 1.5$",
    ),
    (["trainer.enable_progress_bar=yes"], r"^trainer.enable_progress_bar must be true or false"),
    (["network.mbps=0"], r"^network.mbps must be a finite number > 0, got 0$"),
    # W&B's own check of these runs when its run starts, after the data is built (exit 1)
    (
        ["logger=wandb", "logger.wandb.project=a/b"],
        r"^logger.wandb.project must be a W&B project name: at most 128 characters, none of "
        r"/ \\ # \? % :, got 'a/b'$",
    ),
    (
        ["logger=wandb", "logger.wandb.project=" + "p" * 129],
        r"^logger.wandb.project must be a W&B project name",
    ),
    (
        ["logger=wandb", "+logger.wandb.tags=[" + "t" * 65 + "]"],
        r"^logger.wandb.tags must be null or a list of tags of 1 to 64 characters each, got \[",
    ),
    (["network.straggler_fraction=2"], r"^network.straggler_fraction must be a number in \[0, 1\]"),
    (["mechanism.apply_at_eval=sometimes"], r"^mechanism.apply_at_eval must be true or false"),
    (["data.num_parties=two"], r"^data.num_parties must be an integer >= 1, got 'two'$"),
    (
        ["optimizer.weight_decay=abc"],
        r"^optimizer.weight_decay must be a finite number >= 0, got 'abc'$",
    ),
    (["network.latency_s=abc"], r"^network.latency_s must be a finite number >= 0, got 'abc'$"),
    (["algo=fedvs", "algo.K=abc"], r"^segments \(algo.K\) must be an integer >= 1, got 'abc'$"),
    (["test=maybe"], r"^test must be true or false, got 'maybe'$"),
    (["logger=csv", "logger.csv.name=5"], r"^logger.csv.name must be a string, got 5$"),
    (
        ["data.columns=[[0],[1]]"],
        r"^data.columns is read by data.partition=explicit only, got data.partition=quadrants",
    ),
    (
        ["data.val_fraction=0.5", "data.test_fraction=0.6"],
        r"^data.val_fraction \+ data.test_fraction must be < 1 \(the rest trains\), got 0.5 \+ "
        r"0.6 = 1.1$",
    ),
    (["data.partition=diagonal"], r"^data.partition must be one of \('even', .*got 'diagonal'$"),
    (["party.activation=gelu"], r"^party.activation must be one of \('none', .*got 'gelu'$"),
    (["party.embedding_dim=abc"], r"^party.embedding_dim must be an integer >= 1, got 'abc'$"),
    (["trainer.devices=abc"], r"^trainer.devices must be an integer >= 1, -1 \(every device\)"),
    (["trainer.fast_dev_run=-1"], r"^trainer.fast_dev_run must be true, false or an integer >= 0"),
    (["target.metric=5"], r"^target.metric must be a logged metric's name, e.g. val/acc"),
    (["algo.transcript_size=-1"], r"^algo.transcript_size must be an integer >= 0, got -1$"),
    ([*FEDVS, "algo.l_x=0"], r"^algo.l_x must be an integer >= 1, got 0$"),
    (["algo=cascade", "algo.client_speeds=abc"], r"^algo.client_speeds must be a list of numbers"),
    (["algo=cascade", "algo.zoo_space=weights"], r"^algo.zoo_space must be one of \('params'"),
    (["algo=cascade", "algo.mu=0"], r"^algo.mu must be > 0, got 0$"),
    (["algo=pbm", "callbacks.privacy.orders=abc"], r"^callbacks.privacy.orders must be a list of"),
    (
        ["data.num_parties=3"],
        r"^data.partition=quadrants needs num_parties == 4, got 3: set data.num_parties=4, or "
        r"data.partition=strips",
    ),
    (
        ["data=breast_cancer", "data.num_parties=100"],
        r"^data.num_parties must be at most the number of features \(30\), got 100: lower "
        r"data.num_parties$",
    ),
    (
        ["callbacks.checkpoint.dirpath=/etc/hostname/ck"],
        r"^callbacks.checkpoint.dirpath=/etc/hostname/ck cannot be used: \[Errno 20\] Not a "
        r"directory: '/etc/hostname/ck'; choose a directory you can write",
    ),
]
"""Refused before ``trainer.fit`` starts (the test replaces fit with a failure)."""


@pytest.mark.parametrize(
    ("overrides", "message"), BEFORE_FIT, ids=[" ".join(case[0]) for case in BEFORE_FIT]
)
def test_refused_in_one_line_before_anything_trains(make_cfg, monkeypatch, overrides, message):
    def fit(*args, **kwargs):
        raise AssertionError("trainer.fit started")

    monkeypatch.setattr(L.Trainer, "fit", fit)
    with pytest.raises(Exception) as error:
        train(make_cfg("trainer.max_epochs=1", *overrides))
    line = error_summary(error.value)
    assert "\n" not in line and exit_code(error.value) == 2, line
    assert re.search(message, line), line


@pytest.mark.parametrize(
    "overrides",
    [
        ["+optimizer.nesterov=true"],
        ["optimizer=adam", "+optimizer.betas=[0.9,0.99]"],
        ["+trainer.num_nodes=1"],
        ["+trainer.strategy=auto"],
        ["+algo.batch_parties=false"],
        ["logger=wandb", "+logger.wandb.notes=hello"],
        ["+callbacks.stop._target_=conftest.StopAt", "+callbacks.stop.epoch=5"],
        ["trainer.max_epochs=-1", "trainer.max_steps=3"],
        ["trainer.limit_train_batches=0.5", "trainer.val_check_interval=2"],
    ],
    ids=" ".join,
)
def test_added_keys_the_configured_class_takes_are_accepted(make_cfg, overrides):
    """``+key=value`` for a parameter of the node's class (the README's and the tests' uses)."""
    check_schema(make_cfg(*overrides))


def test_every_shipped_config_passes_the_key_and_value_checks(make_cfg):
    """Every experiment (each composes an algo, data and more) and the other groups' options."""
    for experiment in sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")):
        check_schema(make_cfg(f"experiment={experiment}"))
    for option in ("runtime=ray", "logger=wandb", "logger=csv", "debug=limit", "trainer=ddp"):
        check_schema(make_cfg(option))


@pytest.mark.slow
def test_every_option_of_every_group_passes_the_key_and_value_checks(make_cfg):
    for group in sorted(p for p in (ROOT / "conf").iterdir() if p.is_dir()):
        if group.name in ("hydra", "wandb_sweeps"):
            continue
        for option in sorted(p.stem for p in group.glob("*.yaml")):
            # the options whose config leaves a required key unset (???): a value given
            required = {"party_files": ["data.dir=/tmp"], "grpc": ["runtime.certs=/tmp"]}
            check_schema(make_cfg(f"{group.name}={option}", *required.get(option, [])))


@pytest.mark.parametrize(
    ("overrides", "message"), BATTERY, ids=[" ".join(case[0]) for case in BATTERY]
)
def test_bad_configuration_gives_one_clear_line(make_cfg, overrides, message):
    with pytest.raises(Exception) as error:
        train(make_cfg(*overrides, *FAST))
    line = error_summary(error.value)
    assert "\n" not in line
    assert exit_code(error.value) == 2, line
    assert re.search(message, line), line


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_gpu_accelerator_without_a_gpu_is_one_line(make_cfg):
    with pytest.raises(Exception) as error:
        train(make_cfg("trainer.accelerator=gpu", *FAST))
    assert exit_code(error.value) == 2
    assert re.fullmatch(
        r"trainer.accelerator=gpu needs a CUDA GPU, but torch sees none \(torch .*\): use "
        r"trainer.accelerator=cpu or auto",
        error_summary(error.value),
    )


def test_without_a_validation_metric_val_fraction_0_trains(make_cfg):
    results = train(make_cfg("data.val_fraction=0", "optimized_metric=null", *FAST))
    assert results["status"] == "finished" and "val/acc" not in results


@pytest.mark.parametrize("precision", ["32", "64"])
def test_lightning_short_precision_names_run(make_cfg, precision):
    results = train(make_cfg(f"trainer.precision={precision}", *FAST))
    assert results["status"] == "finished"


@pytest.mark.parametrize("algo", ["cascade", "fedvs"])
def test_ddp_refusal_comes_before_any_second_process(make_cfg, monkeypatch, algo):
    """Lightning's DDP launcher starts rank 1 with subprocess.Popen inside fit: here Popen raises,
    so reaching it fails the test (without the early refusal this run would get there)."""

    class LaunchedASecondProcess(Exception):
        pass

    def refuse_to_start(*args, **kwargs):
        raise LaunchedASecondProcess(args)

    for name in ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(subprocess_script.subprocess, "Popen", refuse_to_start)
    protocol = [*FEDVS] if algo == "fedvs" else [f"experiment={algo}_digits"]
    cfg = make_cfg(*protocol, "trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu", *FAST)
    with pytest.raises(ConfigError) as error:
        train(cfg)
    assert re.fullmatch(
        rf"algo={algo} cannot run data-parallel \(trainer.devices x trainer.num_nodes = 2 "
        r"processes, strategy FederationDDPStrategy\): .* trainer=ddp runs algo=fedbcd, "
        r"fedbcd_s, fedpbcd, fedsgd, ldp, npq, pbm, splitnn\. Use trainer=default .*",
        error_summary(error.value),
    )


@pytest.mark.parametrize(
    ("trainer", "processes"),
    [
        (["trainer.devices=3"], 3),
        (["trainer.devices=[0,1]"], 2),
        (["trainer.devices='0,1,2'"], 3),
        (["+trainer.num_nodes=2"], 2),
        (["+trainer.strategy=ddp"], 1),
    ],
)
def test_multi_process_trainers_are_refused_before_launch(make_cfg, trainer, processes):
    """Cascade refuses any of them; npq refuses all but trainer=ddp's strategy."""
    cascade = make_cfg("algo=cascade", *trainer)
    with pytest.raises(ConfigError, match=rf"^algo=cascade cannot run .* = {processes} processes"):
        check_data_parallel(cascade, get_class(cascade.algo._target_))
    npq = make_cfg("algo=npq", *trainer)
    with pytest.raises(
        ConfigError,
        match=rf"^trainer.strategy=\w+ with .* = {processes} processes would not reduce the party "
        r"gradients .*: use trainer=ddp, or trainer.devices=1$",
    ):
        check_data_parallel(npq, get_class(npq.algo._target_))


@pytest.mark.parametrize(
    ("algo", "trainer"),
    [("cascade", ["trainer.devices=1"]), ("npq", ["trainer=ddp"]), ("npq", ["trainer.devices=1"])],
)
def test_single_process_and_federation_ddp_trainers_pass(make_cfg, algo, trainer):
    cfg = make_cfg(f"algo={algo}", *trainer)
    check_data_parallel(cfg, get_class(cfg.algo._target_))


def test_results_lines_are_printed_by_rank_zero_only(make_cfg, capsys, monkeypatch):
    cfg = make_cfg("trainer.max_steps=1", "trainer.limit_val_batches=1", "test=false")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    cli.main(cfg)
    assert "results:" not in capsys.readouterr().out
    monkeypatch.setattr(rank_zero_only, "rank", 0)
    cli.main(cfg)
    results = Path(cfg.paths.output_dir) / "results.json"
    digest = json.loads(results.read_text())["model_digest"]
    assert capsys.readouterr().out.splitlines()[-2:] == [
        f"results: {results}",
        f"model_digest (local): {digest}",
    ]


@pytest.mark.parametrize(
    ("directory", "reason"),
    [("/proc/x", "No such file or directory"), ("/etc/hostname/run", "Not a directory")],
)
def test_impossible_hydra_run_dir_is_one_line(capsys, monkeypatch, directory, reason):
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    config = OmegaConf.create({"hydra": {"run": {"dir": directory}, "sweep": {"dir": directory}}})
    check = instantiate(compose_hydra_callbacks()["output_dir_check"])
    for start, key in ((check.on_run_start, "run"), (check.on_multirun_start, "sweep")):
        with pytest.raises(SystemExit) as stop:
            start(config=config)
        assert stop.value.code == 2
        assert capsys.readouterr().err.splitlines() == [
            f"error: hydra.{key}.dir={directory} cannot be used as the output directory: "
            f"[Errno {20 if 'Not a' in reason else 2}] {reason}: '{directory}'"
        ]


def compose_hydra_callbacks() -> dict:
    """The ``hydra.callbacks`` of the root config (what ``python train.py`` installs)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        cfg = compose("train", return_hydra_config=True)
    GlobalHydra.instance().clear()
    return cfg.hydra.callbacks


def test_unwritable_output_dir_is_one_line(make_cfg):
    cfg = make_cfg(*FAST)
    cfg.paths.output_dir = "/etc/hostname/run"
    with pytest.raises(Exception) as error:
        train(cfg)
    assert exit_code(error.value) == 2
    assert error_summary(error.value).startswith("paths.output_dir=/etc/hostname/run cannot be")


def test_cli_prints_one_line_and_exits_2_and_hydra_full_error_raises(make_cfg, capsys, monkeypatch):
    cfg = make_cfg("algo=pbm", "mechanism.beta=0.3", *FAST)
    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: mechanism.beta must be in (0, 0.25] for PBM, got 0.3"
    )
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(ValueError, match=r"beta must be in \(0, 0.25\]"):
        cli.main(cfg)


def test_the_error_is_printed_once_and_the_run_log_keeps_it(make_cfg, capsys, tmp_path):
    """Hydra logs to the console and to train.log through root handlers: the CLI's ``error:``
    line is the console's only copy of the failure; the log file keeps the logged record."""
    console_stream = io.StringIO()
    console = logging.StreamHandler(console_stream)
    log_file = logging.FileHandler(tmp_path / "train.log")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(console)
    root.addHandler(log_file)
    try:
        with pytest.raises(SystemExit):
            cli.main(make_cfg("algo=pbm", "mechanism.b=abc", *FAST))
        logging.getLogger("vfl_lightning.run.train").info("a record without the marker")
    finally:
        root.removeHandler(console)
        root.removeHandler(log_file)
        root.setLevel(level)
        log_file.close()
    message = "mechanism.b must be an integer >= 1, got 'abc'"
    assert [line for line in capsys.readouterr().err.splitlines() if message in line] == [
        f"error: {message}"
    ]
    assert message not in console_stream.getvalue()
    # other records still reach the console; the results path goes to the run's log only
    assert "a record without the marker" in console_stream.getvalue()
    assert "results:" not in console_stream.getvalue()
    assert f"run failed: {message}" in (tmp_path / "train.log").read_text()
    assert "results:" in (tmp_path / "train.log").read_text()


def test_cli_run_failure_exits_1_in_one_line(make_cfg, capsys):
    cfg = make_cfg("optimizer.lr=1e6", "trainer.log_every_n_steps=1", "trainer.max_epochs=1")
    with pytest.raises(SystemExit) as stop:
        cli.main(cfg)
    assert stop.value.code == 1
    assert (
        capsys.readouterr()
        .err.splitlines()[-1]
        .startswith("error: training stopped: the training loss became non-finite at round")
    )


def test_a_diverging_server_names_algo_server_lr(make_cfg, capsys):
    """The message names the configured keys, not a scheduled or server value as optimizer.lr."""
    cfg = make_cfg(
        "optimizer.lr=0.01",
        "algo.server_lr=1e6",
        "trainer.log_every_n_steps=1",
        "trainer.max_epochs=1",
    )
    with pytest.raises(SystemExit):
        cli.main(cfg)
    last = capsys.readouterr().err.splitlines()[-1]
    assert "(optimizer.lr=0.01, algo.server_lr=1e+06) too large" in last


def test_cli_subprocess_one_error_line_no_traceback_and_the_error_in_the_run_log(tmp_path):
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    env.pop("HYDRA_FULL_ERROR", None)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "train.py"),
            "experiment=fedvs_digits",
            "party=mlp",
            "logger=none",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    output = proc.stdout + proc.stderr
    assert "Traceback" not in output
    errors = [line for line in output.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: algo=fedvs needs polynomial-network parties (party=pn), got MLPEncoder"
    ]
    assert proc.stderr.splitlines()[-1] == errors[0]
    assert "results" not in output  # a refused configuration prints its error line alone
    assert "needs polynomial-network parties" not in output.replace(errors[0], "")
    assert "needs polynomial-network parties" in (tmp_path / "train.log").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == errors[0][len("error: ") :]


def test_no_training_batches_is_accepted_to_evaluate_a_checkpoint():
    """``trainer.limit_train_batches=0`` with a ``ckpt_path`` evaluates that checkpoint; without
    one (or with any limit above 0) the check above decides."""

    def config(limit, ckpt_path):
        return OmegaConf.create({"trainer": {"limit_train_batches": limit}, "ckpt_path": ckpt_path})

    check_training_batches(config(0, "/runs/a/checkpoints/last.ckpt"))
    check_training_batches(config(1, None))
    check_training_batches(config(None, None))
    with pytest.raises(ConfigError, match=r"^trainer.limit_train_batches=0 trains nothing"):
        check_training_batches(config(0, None))


def _raised_in(module: str, message: str) -> ValueError:
    """A ValueError whose innermost frame belongs to ``module`` (as Lightning's own raises do)."""
    scope = {"__name__": module}
    exec("def fail(message):\n    raise ValueError(message)", scope)
    try:
        scope["fail"](message)
    except ValueError as error:
        return error
    raise AssertionError("not raised")


def test_a_trainer_argument_in_lightnings_own_message_is_named_as_this_configs_key():
    """Lightning's fit loop refuses trainer.val_check_interval above an epoch's batches in its own
    words (`val_check_interval`, `check_val_every_n_epoch=None`): the line names our keys."""
    message = (
        " `val_check_interval` (25) must be less than or equal to the number of the training "
        "batches (9). If you want to disable validation set `limit_val_batches` to 0.0 instead. "
        "If you want to validate based on the total training batches, set "
        "`check_val_every_n_epoch=None`. `not_an_argument` stays."
    )
    line = error_summary(_raised_in("lightning.pytorch.loops.fit_loop", message))
    assert line == (
        "trainer.val_check_interval (25) must be less than or equal to the number of the training "
        "batches (9). If you want to disable validation set trainer.limit_val_batches to 0.0 "
        "instead. If you want to validate based on the total training batches, set "
        "trainer.check_val_every_n_epoch=null. `not_an_argument` stays."
    )
    # the same words raised outside Lightning are left as they are
    assert error_summary(_raised_in("somewhere.else", message)) == " ".join(message.split())
