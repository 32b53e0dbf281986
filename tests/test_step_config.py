"""No configuration node is read inside a step: every protocol family trains and evaluates with
OmegaConf's containers locked for the length of each batch (any node access, iteration or
conversion raises), so per-batch settings are plain Python values read once at build time."""

from __future__ import annotations

import lightning as L
import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.basecontainer import BaseContainer

from vfl_lightning.train import train

LOCKED = (
    (DictConfig, "_get_node"),
    (ListConfig, "_get_node"),
    (DictConfig, "__iter__"),
    (ListConfig, "__iter__"),
    (DictConfig, "__len__"),
    (ListConfig, "__len__"),
    (BaseContainer, "_to_content"),
)


class ConfigLocked(L.Callback):
    """Makes every OmegaConf container unreadable from a batch's start to its end (training,
    validation and test batches); ``accessed`` lists what was tried."""

    accessed: list[str] = []

    def __init__(self) -> None:
        self.saved: list[tuple[type, str, object]] = []

    def lock(self, *args) -> None:
        def refuse(name):
            def method(container, *args, **kwargs):
                ConfigLocked.accessed.append(name)
                raise AssertionError(f"configuration read inside a step ({name})")

            return method

        for owner, name in LOCKED:
            self.saved.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, refuse(f"{owner.__name__}.{name}"))

    def unlock(self, *args) -> None:
        for owner, name, method in reversed(self.saved):
            if method is None:  # inherited: remove the lock, the base class's method shows again
                delattr(owner, name)
            else:
                setattr(owner, name, method)
        self.saved.clear()

    on_train_batch_start = on_validation_batch_start = on_test_batch_start = lock
    on_train_batch_end = on_validation_batch_end = on_test_batch_end = unlock

    def on_exception(self, *args) -> None:
        self.unlock()


def test_the_lock_catches_a_read():
    cfg = OmegaConf.create({"a": {"b": 1}, "c": [1, 2]})
    lock = ConfigLocked()
    lock.lock()
    try:
        for read in (lambda: cfg.a, lambda: cfg["a"], lambda: list(cfg.c), lambda: dict(cfg)):
            with pytest.raises(AssertionError, match="configuration read inside a step"):
                read()
        with pytest.raises(AssertionError):
            OmegaConf.to_container(cfg)
    finally:
        lock.unlock()
    assert cfg.a.b == 1 and list(cfg.c) == [1, 2]


@pytest.mark.parametrize(
    "workload",
    [
        ["algo=npq"],
        ["algo=pbm"],
        ["algo=ldp"],
        ["algo=fedbcd"],
        ["experiment=cascade_digits"],
        ["algo=zoo_vfl"],
        ["experiment=fedvs_digits"],
        ["experiment=fedvs_digits", "algo=fedvs_wait_dp"],
    ],
)
def test_no_configuration_node_is_read_inside_a_step(make_cfg, workload):
    cfg = make_cfg(
        *workload,
        "trainer.max_epochs=2",
        "trainer.max_steps=-1",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
        "trainer.log_every_n_steps=1",
        "+callbacks.config_locked._target_=test_step_config.ConfigLocked",
    )
    ConfigLocked.accessed = []
    results = train(cfg)
    assert results["status"] == "finished"
    assert ConfigLocked.accessed == []
