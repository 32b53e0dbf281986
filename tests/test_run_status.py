"""A run never looks finished when it was not: refused resumes with a changed configuration,
refused float16 AMP, a stop at the first non-finite loss, and results.json with a status."""

import json
import math
import signal
import sys
from pathlib import Path

import pytest
import torch
from conftest import stop_at

from vfl_lightning.errors import ConfigError, NonFiniteLoss, Terminated
from vfl_lightning.run.outcome import exit_code, finish_wandb
from vfl_lightning.train import strict_json, train

SHORT = ["trainer.limit_train_batches=3", "trainer.limit_val_batches=1", "test=false"]


def results_of(cfg) -> dict:
    text = (Path(cfg.paths.output_dir) / "results.json").read_text()
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"non-strict JSON: {name}"))


@pytest.fixture
def pbm_checkpoint(make_cfg):
    cfg = make_cfg("algo=pbm", *SHORT, "trainer.max_epochs=1")
    train(cfg)
    return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["algo=pbm", "seed=5"], "seed=5 (checkpoint: 0)"),
        (["algo=npq"], "algo.name='npq' (checkpoint: 'pbm')"),
        (["algo=pbm", "optimizer.lr=0.5"], "optimizer.lr=0.5 (checkpoint: 0.01)"),
        (
            ["algo=pbm", "data.partition=strips"],
            "data.partition='strips' (checkpoint: 'quadrants')",
        ),
        (["algo=pbm", "mechanism.b=4"], "mechanism.b=4 (checkpoint: 16)"),
        (["algo=pbm", "party.hidden=[8]"], "party.hidden=[8]"),
    ],
)
def test_resume_with_a_changed_protocol_config_is_refused(
    make_cfg, pbm_checkpoint, overrides, named
):
    cfg = make_cfg(*SHORT, "trainer.max_epochs=2", f"ckpt_path={pbm_checkpoint}", *overrides)
    with pytest.raises(
        ConfigError, match="resuming from ckpt_path=.* different configuration"
    ) as e:
        train(cfg)
    assert named in str(e.value)
    assert results_of(cfg)["status"] == "failed"


def test_resume_with_the_same_config_and_longer_training_is_accepted(make_cfg, pbm_checkpoint):
    cfg = make_cfg("algo=pbm", *SHORT, "trainer.max_epochs=2", f"ckpt_path={pbm_checkpoint}")
    assert train(cfg)["status"] == "finished"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", r"is not a readable checkpoint \(truncated, empty or another kind of file\)"),
        (b"not a checkpoint at all", r"is not a readable checkpoint"),
        ("truncated", r"is not a readable checkpoint"),
        ("foreign", r"was not written by vfl_lightning \(no 'vfl' state\)"),
        ("missing", r"does not exist or is not a file"),
    ],
)
def test_bad_checkpoint_files_are_refused_in_one_line(make_cfg, pbm_checkpoint, content, message):
    path = pbm_checkpoint.parent / "bad.ckpt"
    if content == "truncated":
        path.write_bytes(pbm_checkpoint.read_bytes()[:2000])
    elif content == "foreign":
        torch.save({"state_dict": {}}, path)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    cfg = make_cfg("algo=pbm", *SHORT, f"ckpt_path={path}")
    with pytest.raises(ConfigError, match=message) as error:
        train(cfg)
    assert exit_code(error.value) == 2 and "\n" not in str(error.value)


def test_float16_amp_is_refused_from_the_config(make_cfg):
    cfg = make_cfg("trainer.precision=16-mixed", *SHORT)
    with pytest.raises(ConfigError, match=r"trainer.precision must be one of .*got '16-mixed'"):
        train(cfg)


def test_huge_learning_rate_stops_at_the_first_non_finite_loss(make_cfg):
    cfg = make_cfg(
        "optimizer.lr=1e6", *SHORT, "trainer.log_every_n_steps=1", "trainer.max_epochs=3"
    )
    with pytest.raises(
        NonFiniteLoss, match=r"became non-finite at round \d+.*optimizer.lr=1e\+06"
    ) as e:
        train(cfg)
    assert exit_code(e.value) == 1
    results = results_of(cfg)
    assert results["status"] == "failed" and "non-finite" in results["error"]
    assert results["global_step"] < 3 * 3  # stopped before the end
    assert results["comm/rounds"] == results["global_step"]  # what is known is recorded


def test_nan_mid_epoch_stops_at_the_next_check_and_keeps_the_last_good_checkpoint(make_cfg):
    cfg = make_cfg(
        "algo=pbm",
        "trainer.limit_train_batches=6",
        "trainer.limit_val_batches=1",
        "trainer.log_every_n_steps=4",
        "trainer.max_epochs=3",
        "test=false",
        *stop_at(epoch=1, batch=2, how="poison"),
    )
    with pytest.raises(NonFiniteLoss, match="the training loss became non-finite at round 8;"):
        train(cfg)
    # the parties refuse round 8's NaN gradient at once (the server's periodic check would have
    # noticed at round 12, every 4 steps): the run stops at round 8, naming the server's loss
    assert results_of(cfg)["global_step"] == 8
    checkpoint = torch.load(
        Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=False
    )
    assert checkpoint["global_step"] == 6
    assert all(torch.isfinite(v).all() for v in checkpoint["state_dict"].values())


def test_non_finite_check_names_the_first_bad_round(make_cfg):
    from conftest import fit

    cfg = make_cfg("trainer.max_steps=3", "trainer.limit_val_batches=0")
    _, module, _ = fit(cfg)
    module.check_finite()
    module._first_bad_round = 1
    with pytest.raises(NonFiniteLoss, match="the training loss became non-finite at round 1"):
        module.check_finite()
    module._first_bad_round = None
    with torch.no_grad():
        module.head.weight[0, 0] = math.inf
    with pytest.raises(NonFiniteLoss, match="a model parameter became non-finite at round 2"):
        module.check_finite()


def test_finished_run_has_status_and_strict_json(make_cfg):
    cfg = make_cfg("algo=pbm", *SHORT, "trainer.max_epochs=1")
    results = train(cfg)
    assert results["status"] == "finished" == results_of(cfg)["status"]
    assert strict_json({"a": [math.nan, 1.0, {"b": -math.inf}]}) == {"a": [None, 1.0, {"b": None}]}


def test_ctrl_c_is_recorded_as_interrupted(make_cfg):
    """Lightning turns Ctrl-C into ``sys.exit(1)``; the run raises Terminated with the line that
    says where it stopped and how to resume (results.json's ``error``)."""
    cfg = make_cfg("algo=npq", *SHORT, "trainer.max_epochs=2", *stop_at(1, 1, how="interrupt"))
    handler = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Terminated) as stop:
            train(cfg)
    finally:
        signal.signal(signal.SIGINT, handler)
    results = results_of(cfg)
    assert results["status"] == "interrupted" and stop.value.exit_code == 130
    assert (
        results["error"]
        == str(stop.value)
        == (
            f"stopped by Ctrl-C at epoch 1, training round {results['global_step']}: results.json "
            f"has status interrupted; resume with ckpt_path={cfg.paths.output_dir}/checkpoints/"
            "last.ckpt"
        )
    )


def test_wandb_is_finished_with_the_runs_exit_code(monkeypatch):
    calls = []

    class FakeWandb:
        run = object()

        @staticmethod
        def finish(exit_code=None):
            calls.append(exit_code)

    monkeypatch.setitem(sys.modules, "wandb", FakeWandb)
    finish_wandb(1)
    finish_wandb(0)
    assert calls == [1, 0]
