"""The key index (vfl_lightning/run/key_index.json) agrees with the code, and the early check that
reads it refuses what the full check refuses, without torch or Lightning."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vfl_lightning.errors import ConfigError
from vfl_lightning.run import key_index
from vfl_lightning.run.early import EVALUATION_METRICS, check_early

ROOT = Path(__file__).resolve().parents[1]


def test_the_key_index_matches_the_code():
    stored = json.loads(key_index.INDEX_FILE.read_text())
    changes = key_index.differences(stored, key_index.build())
    assert not changes, (
        "vfl_lightning/run/key_index.json disagrees with the code:\n  "
        + "\n  ".join(changes)
        + f"\nrun `{key_index.COMMAND}` and commit the file"
    )


def test_a_disagreement_names_the_key_and_the_target():
    built = key_index.build()
    stale = json.loads(json.dumps(built))
    stale["targets"]["vfl_lightning.mechanisms.PBM"].remove("beta")
    stale["targets"]["torch.optim.SGD"].append("nesterov_typo")
    del stale["targets"]["vfl_lightning.wire.Network"]
    stale["targets"]["my.Gone"] = ["x"]
    stale["choices"]["partitions"].remove("views")
    assert key_index.differences(stale, built) == [
        "vfl_lightning.wire.Network is named by a config but missing from the key index",
        "my.Gone is in the key index but no config names it",
        "torch.optim.SGD no longer takes nesterov_typo, which the key index lists",
        "vfl_lightning.mechanisms.PBM takes beta, which the key index lacks",
        "partitions: 'views' is only in the code",
    ]


def test_a_new_target_in_a_config_folder_is_indexed(tmp_path):
    (tmp_path / "algo").mkdir()
    (tmp_path / "algo" / "mine.yaml").write_text(
        "_target_: vfl_lightning.callbacks.TargetTracker\nnested:\n  _target_: torch.optim.SGD\n"
    )
    (tmp_path / "hydra").mkdir()
    (tmp_path / "hydra" / "x.yaml").write_text("_target_: not.Indexed\n")
    index = key_index.build([tmp_path])
    assert sorted(index["targets"]) == ["torch.optim.SGD", "vfl_lightning.callbacks.TargetTracker"]
    assert index["targets"]["vfl_lightning.callbacks.TargetTracker"] == [
        "metric",
        "mode",
        "stop",
        "value",
    ]


def test_a_class_passing_kwargs_to_another_library_takes_any_key():
    strategy = "vfl_lightning.parallel.FederationDDPStrategy"
    assert key_index.load()["targets"][strategy] is None
    assert key_index.indexed_parameters(strategy) is None
    assert key_index.indexed_parameters("my_package.Mine") is key_index.NOT_INDEXED


def test_kwargs_passed_to_a_named_function_take_its_keys():
    """W&B's logger names the function its ``**kwargs`` reach (``KWARGS_GO_TO``)."""
    import inspect

    import wandb

    logger = key_index.indexed_parameters("vfl_lightning.loggers.WandbLogger")
    assert {"offline", "log_model", "save_dir", "project", "notes", "entity"} <= logger
    assert set(inspect.signature(wandb.init).parameters) <= logger


def test_locate_names_the_missing_part():
    assert key_index.locate("os.path.join") is os.path.join
    with pytest.raises(ImportError, match="no module named 'nonexistent'"):
        key_index.locate("nonexistent.Module")
    with pytest.raises(ImportError, match="module 'os' has no attribute 'nope'"):
        key_index.locate("os.nope")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["+data.bach_size=8"], r"^data.bach_size is not a config key \(data \(vfl_lightning"),
        (["optimizer.lr=-1"], r"^optimizer.lr must be a finite number >= 0, got -1$"),
        (["data.batch_size=abc"], r"^data.batch_size must be an integer >= 1, got 'abc'$"),
        (["party.activation=gelu"], r"^party.activation must be one of \('none', 'relu'"),
        (["data.partition=diagonal"], r"^data.partition must be one of \('even', 'explicit'"),
        (["seed=-1"], r"^seed must be an integer in \[0, 2\^32 - 1\], got -1$"),
        (
            ["optimized_metric=val/nonexistent"],
            r"^optimized_metric=val/nonexistent is not a metric runs log \(val/ has val/acc, "
            r"val/acc_clean, val/auroc, val/auprc, val/loss; auroc and auprc with binary labels "
            r"only\): choose one of them$",
        ),
        (["optimized_metric=val/accuracy"], r"did you mean optimized_metric=val/acc\?$"),
        (["target.metric=test/aucroc"], r"^target.metric=test/aucroc .*did you mean .*test/auroc"),
        (
            ["algo._target_=nonexistent.Module"],
            r"^algo._target_=nonexistent.Module cannot be imported: there is no module named "
            r"'nonexistent': check the spelling, or install the package",
        ),
        (
            ["algo._target_=os.system"],
            r"^algo._target_=os.system is a builtin_function_or_method, not a protocol \(a "
            r"subclass of vfl_lightning.algorithms.base.VFLModule, e.g. ",
        ),
        (["algo._target_=json.JSONDecoder"], r"^algo._target_=json.JSONDecoder is a class, not a "),
        (
            ["data.loader=nope"],
            r"^data.loader must be null \(the built-in dataset data.name\), one of \('breast_cancer'"
            r".*\) or a loader's dotted path package.module.function, got 'nope'$",
        ),
        (
            ["data.name=mnsit"],
            r"^data.name=mnsit is not a built-in dataset \(with data.loader=null the name chooses "
            r"the loader\): did you mean data=mnist\? choose one with data=NAME \(breast_cancer, ",
        ),
        (
            ["algo._target_=os.nope"],
            r"^algo._target_=os.nope cannot be imported \(module 'os' has no attribute 'nope'\)",
        ),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_the_early_check_refuses(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_early(make_cfg(*overrides))


def test_the_protocol_base_class_is_where_the_early_refusal_says():
    from vfl_lightning.algorithms import SyncVFL
    from vfl_lightning.algorithms.base import VFLModule

    assert VFLModule.__module__ == "vfl_lightning.algorithms.base" and issubclass(
        SyncVFL, VFLModule
    )


def test_a_target_in_a_running_script_passes_the_early_check(make_cfg, monkeypatch):
    """A script run as ``python script.py`` is ``__main__``, imported without an import spec
    (``importlib.util.find_spec`` raises for it): a ``_target_`` there (a bench's callback) is
    importable, and a module that is neither imported nor installed is still refused."""
    import sys
    import types

    script = types.ModuleType("__main__")
    script.__spec__ = None
    monkeypatch.setitem(sys.modules, "__main__", script)
    check_early(make_cfg("+callbacks.counter._target_=__main__.make_counter"))
    with pytest.raises(ConfigError, match="no module named 'nonexistent'"):
        check_early(make_cfg("+callbacks.counter._target_=nonexistent.make_counter"))


def test_a_dataset_of_the_library_or_a_dotted_loader_passes_the_early_check(make_cfg):
    for overrides in (
        ["data.loader=mnist_small"],
        ["data.loader=plugins.blobs.load_blobs", "data.name=blobs"],
        ["data.name=plugins.blobs.load_blobs"],
        ["data=party_files", "data.dir=/tmp"],
    ):
        check_early(make_cfg(*overrides))


def test_every_experiment_passes_the_early_check(make_cfg):
    for experiment in sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")):
        check_early(make_cfg(f"experiment={experiment}"))


def test_evaluation_metrics_are_what_runs_log(make_cfg):
    """Every ``val/`` and ``test/`` metric of a binary and a multiclass run is one the early check
    accepts (a noisy mechanism adds ``acc_clean``)."""
    from vfl_lightning.train import train

    fast = ["trainer.max_steps=2", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1"]
    logged = set()
    for overrides in (["algo=ldp"], ["experiment=npq_breast_cancer"]):
        results = train(make_cfg(*fast, *overrides))
        logged |= {k.split("/", 1)[1] for k in results if k.split("/")[0] in ("val", "test")}
    assert logged == set(EVALUATION_METRICS)


def test_the_command_line_module_imports_neither_torch_nor_lightning():
    script = (
        "import sys, vfl_lightning.cli, vfl_lightning.run.early, vfl_lightning.run.hydra_cli\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'lightning', "
        "'pytorch_lightning', 'numpy', 'ray', 'wandb', 'matplotlib', 'torchmetrics', 'scipy'}))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]"


def test_a_run_imports_ray_wandb_grpc_and_the_report_only_where_it_uses_them():
    """What ``python train.py`` imports to train: torch and Lightning, not Ray (runtime=ray), W&B
    (logger=wandb), gRPC (runtime=grpc) nor the report."""
    script = (
        "import sys, vfl_lightning.run.train\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('ray', 'wandb', 'grpc') or "
        "m.startswith('vfl_lightning.report')))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_config_files_read_as_omegaconf_reads_them(tmp_path):
    """The early check reads conf/ with libyaml and OmegaConf's scalar rules: the same values as
    OmegaConf's own loader, for every shipped file and for the scalars that differ in YAML 1.1."""
    from omegaconf import OmegaConf

    from vfl_lightning.run.schema import ConfigYAMLLoader

    (tmp_path / "scalars.yaml").write_text(
        "a: 1e-5\nb: 2024-01-01\nc: .5\nd: 1_000\ne: ???\nf: ${seed}\ng: null\nh: [1.0, x]\n"
    )
    for file in [tmp_path / "scalars.yaml", *sorted((ROOT / "conf").rglob("*.yaml"))]:
        text = file.read_text()
        ours = yaml.load(text, Loader=ConfigYAMLLoader)
        ours = {} if ours is None else ours  # an empty file: no keys either way
        assert ours == OmegaConf.to_container(OmegaConf.create(text), resolve=False), file


def make_counter():
    """A callback factory: a function ``_target_``, as Hydra allows (never called here)."""
    return object()


def test_a_callback_factory_function_is_checked_without_an_error_log(make_cfg, caplog):
    """The audits' protocol check looks at callback classes only: a factory function passes
    without Hydra's "Error getting class" log line, and an audit class is still asked."""
    from vfl_lightning.run.config_checks import check_audit_data

    with caplog.at_level(logging.ERROR):
        check_audit_data(make_cfg(f"+callbacks.counter._target_={__name__}.make_counter"))
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    with pytest.raises(ConfigError, match="audit"):
        check_audit_data(make_cfg("algo=fedvs", "audit=canary_message"))


def test_the_command_takes_no_arguments_and_leaves_the_index_alone_on_one(capsys):
    """``--help`` and an unknown flag do not rebuild the file."""
    from vfl_lightning.run import key_index

    before = key_index.INDEX_FILE.stat().st_mtime_ns
    for argv, code in ((["--bogus"], 2), (["--help"], 0)):
        with pytest.raises(SystemExit) as stop:
            key_index.main(argv)
        assert stop.value.code == code
    assert capsys.readouterr().err == "error: unrecognized arguments: --bogus (see --help)\n"
    assert key_index.INDEX_FILE.stat().st_mtime_ns == before
