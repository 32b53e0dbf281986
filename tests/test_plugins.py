"""A protocol, a mechanism, an attack, a dataset and a partition from outside the library (the
modules and YAML files of tests/plugins/, found through ``hydra.searchpath``), taken through
training, results.json and the report with no library file naming them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import QUIET, compose_config, run_train_py

from vfl_lightning.report import make_report

PLUGINS = Path(__file__).parent / "plugins"
SEARCH = f"hydra.searchpath=[file://{PLUGINS / 'conf'}]"
SHORT = ["trainer.max_epochs=2", "callbacks.checkpoint=null", "test=false"]


def run(out: Path, *overrides: str) -> dict:
    run_train_py([*QUIET, SEARCH, *SHORT, f"hydra.run.dir={out}", *overrides])
    return json.loads((out / "results.json").read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("plugins")
    protocol = root / "protocol"
    partition = root / "partition"
    run(
        protocol,
        "algo=sign_downlink",
        "mechanism=uniform",
        "data=blobs",
        "attack=uplink_centroids",
    )
    run(partition, "algo=npq", "data=digits_interleaved")
    baseline = root / "baseline"
    run(baseline, "algo=npq", "data=blobs")
    return [protocol, partition, baseline]


def test_plugin_protocol_mechanism_attack_and_dataset_train(runs):
    results = json.loads((runs[0] / "results.json").read_text())
    assert results["status"] == "finished"
    assert (results["algo"], results["mechanism"]) == ("sign_downlink", "uniform")
    assert results["data"] == "blobs"
    # the plugins' own wire formats: 4-bit embeddings up, 1-bit signs and a float32 scale down
    rows = 600 - round(600 * 0.15) * 2  # the training split (val and test fractions 0.15)
    parties, width, epochs = 3, 16, 2
    elements = epochs * rows * parties * width
    rounds = results["comm/rounds"]
    assert results["comm/uplink_mb"] == pytest.approx(4 * elements / 8e6, rel=1e-3)
    assert results["comm/downlink_mb"] == pytest.approx(
        (elements + 32 * parties * rounds) / 8e6, rel=1e-3
    )
    # well-separated blobs: the eavesdropper's centroid guess beats chance by far
    assert results["attack/uplink_centroids/baseline"] == pytest.approx(1 / 3)
    assert results["attack/uplink_centroids/acc"] > 0.6


def test_plugin_partition_gives_each_party_every_mth_pixel(runs, tmp_path):
    from vfl_lightning.train import build

    results = json.loads((runs[1] / "results.json").read_text())
    assert results["status"] == "finished" and results["num_parties"] == 4
    cfg = compose_config(tmp_path, SEARCH, "algo=npq", "data=digits_interleaved")
    datamodule, _ = build(cfg)
    for m, party in enumerate(datamodule.slices):
        assert np.array_equal(party.index, np.arange(m, 64, 4))


def test_plugin_partition_takes_its_options_and_the_run_seed(tmp_path):
    from plugins.shuffled_blocks import shuffled_blocks

    from vfl_lightning.train import build

    slices = {}
    for seed in (3, 4):
        cfg = compose_config(
            tmp_path, SEARCH, "algo=npq", "data=digits_shuffled_blocks", f"seed={seed}"
        )
        datamodule, _ = build(cfg)
        expected = shuffled_blocks((1, 8, 8), 4, block=4, seed=seed)
        assert [s.index.tolist() for s in datamodule.slices] == [e.index.tolist() for e in expected]
        slices[seed] = [s.index.tolist() for s in datamodule.slices]
    assert slices[3] != slices[4]
    with_option = compose_config(
        tmp_path, SEARCH, "algo=npq", "data=digits_shuffled_blocks", "data.partition.block=8"
    )
    assert [len(s.index) for s in build(with_option)[0].slices] == [16] * 4


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("data.partition.block=four", "data.partition.block must be a finite number, got 'four'"),
        ("data.partition.block=2.5", "data.partition.block must be an integer for shuffled_blocks"),
        (
            "data.partition._target_=plugins.nowhere.split",
            "data.partition._target_=plugins.nowhere",
        ),
    ],
)
def test_a_bad_plugin_partition_option_is_one_error_line(tmp_path, override, words):
    from vfl_lightning.errors import ConfigError
    from vfl_lightning.train import train

    cfg = compose_config(tmp_path, SEARCH, "algo=npq", "data=digits_shuffled_blocks", override)
    with pytest.raises(ConfigError) as refused:
        train(cfg)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_plugin_runs_reach_the_report(runs, tmp_path):
    out = tmp_path / "report"
    files = {p.name for p in make_report([runs[0], runs[2]], out, progress=False)}
    page = (out / "report.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| sign_downlink")]
    assert rows and any(line.startswith("| npq") for line in page.splitlines())
    # the plugin's report.recipes put it in the PBM recipe, whose table lists it; no group is
    # noisy (no finite feature ε), so none of the recipe's per-mechanism figures is drawn
    assert "## PBM-VFL: accuracy, privacy, communication" in page
    assert not any(name.endswith("_acc_vs_epoch.png") for name in files)


def test_plugin_attack_declares_its_headline(runs, tmp_path):
    """The privacy recipe draws and tabulates the plugin attack by the metric it declares in
    results.json (``attack/<name>/headline``), which no library file names."""
    results = json.loads((runs[0] / "results.json").read_text())
    assert results["attack/uplink_centroids/headline"] == {
        "metric": "acc",
        "label": "uplink-centroid label accuracy",
    }
    out = tmp_path / "report"
    make_report([runs[0]], out, recipe="privacy", name="privacy", progress=False)
    page = (out / "privacy.md").read_text()
    assert "| group | defense | seeds | main acc | acc | DCS |" in page
    row = next(line for line in page.splitlines() if line.startswith("| sign_downlink"))
    assert row.split(" | ")[4].startswith(f"{results['attack/uplink_centroids/acc']:.3f}")
