"""train() checks the schema once: the early check (every check that needs no import) walks the
config's values, then only the keys of classes the key index does not hold are read from their
imported signatures. A key such a class does not take is still refused before anything is
built."""

from __future__ import annotations

import pytest
from conftest import compose_config

from vfl_lightning.errors import ConfigError
from vfl_lightning.run import key_index, schema
from vfl_lightning.train import train

UNINDEXED = "lightning.pytorch.callbacks.Timer"
"""A callback class of another library: no shipped config names it, so the key index lacks it."""


class ChecksDone(Exception):
    """Raised right after the configuration checks, so nothing is built."""


def test_the_class_used_below_is_not_in_the_key_index():
    assert key_index.indexed_parameters(UNINDEXED) is key_index.NOT_INDEXED


def test_a_key_an_unindexed_class_does_not_take_is_refused_before_the_build(tmp_path, monkeypatch):
    def built(*args, **kwargs):
        raise AssertionError("the run was built despite the unknown key")

    monkeypatch.setattr("vfl_lightning.run.train.build_in_data_dir", built)
    cfg = compose_config(
        tmp_path,
        f"+callbacks.timer._target_={UNINDEXED}",
        "+callbacks.timer.duration=null",
        "+callbacks.timer.durration=1",
    )
    with pytest.raises(ConfigError, match=r"^callbacks.timer.durration is not a config key "):
        train(cfg)


def test_a_key_the_unindexed_class_takes_passes(tmp_path, monkeypatch):
    def checked(cfg):
        raise ChecksDone

    monkeypatch.setattr("vfl_lightning.run.train.check_config", checked)
    cfg = compose_config(
        tmp_path,
        f"+callbacks.timer._target_={UNINDEXED}",
        "+callbacks.timer.duration=null",
        "+callbacks.timer.interval=epoch",
    )
    with pytest.raises(ChecksDone):
        train(cfg)


def test_train_walks_the_values_and_the_unset_keys_once(tmp_path, monkeypatch):
    walks = {"values": 0, "missing": 0}
    check_values, check_missing = schema.check_values, schema.check_missing

    def counted_values(*args, **kwargs):
        walks["values"] += 1
        return check_values(*args, **kwargs)

    def counted_missing(node, prefix=""):
        if not prefix:  # the walk's first call (it recurses into each node)
            walks["missing"] += 1
        return check_missing(node, prefix)

    def checked(cfg):
        raise ChecksDone

    monkeypatch.setattr(schema, "check_values", counted_values)
    monkeypatch.setattr(schema, "check_missing", counted_missing)
    monkeypatch.setattr("vfl_lightning.run.train.check_config", checked)
    with pytest.raises(ChecksDone):
        train(compose_config(tmp_path))
    assert walks == {"values": 1, "missing": 1}
