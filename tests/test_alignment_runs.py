"""Runs on aligned rows: partial overlap trains on exactly the rows every party holds, the PSI at
full overlap changes nothing, party files with their own ids and order, and the alignment's bytes
and time are counted (under Ray: tests/test_ray_alignment.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compose_config

from vfl_lightning.data.alignment import simulate_holdings
from vfl_lightning.data.datamodule import VerticalDataModule
from vfl_lightning.data.export import main as export
from vfl_lightning.data.files_datamodule import PartyFilesDataModule
from vfl_lightning.data.party_files import read_party_file
from vfl_lightning.train import train

pytest.importorskip("rbcl")
SHORT = ["trainer.max_epochs=1", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1"]
SHORT += ["test=false"]


def test_partial_overlap_keeps_exactly_the_rows_every_party_holds():
    full = VerticalDataModule(name="breast_cancer", num_parties=3, partition="even")
    partial = VerticalDataModule(name="breast_cancer", num_parties=3, partition="even", overlap=0.4)
    holdings = simulate_holdings(569, 0.4, 3, seed=0)
    common = set.intersection(*(set(h.tolist()) for h in holdings))
    assert partial.alignment.aligned_rows == len(common) == round(0.4 * 569)
    for stage in ("train", "val", "test"):
        kept = partial.split_index[stage]
        assert set(kept.tolist()) == common & set(full.split_index[stage].tolist())
        position = np.searchsorted(full.split_index[stage], kept)
        assert np.array_equal(full.split_index[stage][position], kept)  # the label holder's order
        assert torch.equal(partial.splits[stage].y, full.splits[stage].y[position])
        for a, b in zip(partial.splits[stage].xs, full.splits[stage].xs, strict=True):
            assert torch.equal(a, b[position])


def test_full_overlap_through_the_psi_trains_bit_for_bit_as_without(make_cfg):
    common = ["algo=pbm", *SHORT]
    plain = train(make_cfg(*common))
    aligned = train(make_cfg(*common, "data.psi=always"))
    assert aligned["model_digest"] == plain["model_digest"]
    assert aligned["data/aligned_rows"] == plain["data/aligned_rows"] == 1797
    assert plain["comm/psi_mb"] == 0.0
    # 4 parties x 1797 ids: HELLO, REPLY (two lists), MATCH of 32-byte elements, and ALIGN's
    # 8-byte positions, plus a header or count per message
    payload = 4 * ((1797 + 2 * 1797 + 1797) * 32 + 1797 * 8) / 1e6
    assert payload < aligned["comm/psi_mb"] < payload * 1.01
    assert aligned["time/simulated_s"] > plain["time/simulated_s"]
    assert aligned["comm/uplink_mb"] == plain["comm/uplink_mb"]


def test_the_clock_charges_the_psi_by_the_network_model(make_cfg):
    common = ["algo=splitnn", "data=breast_cancer", "data.num_parties=2", "data.overlap=0.5"]
    common += SHORT + ["trainer.limit_train_batches=1"]
    fast = train(make_cfg(*common, "network.group_ops_per_second=1e12", "network.mbps=1e9"))
    slow = train(make_cfg(*common, "network.group_ops_per_second=1000"))
    # the label holder hashes 569 ids, then blinds both lists for each party; each party
    # hashes and blinds its own and blinds the label holder's: at least 569 ops on each side
    assert slow["time/simulated_s"] - fast["time/simulated_s"] > 2 * 569 / 1000
    assert slow["data/aligned_rows"] == fast["data/aligned_rows"] == round(0.5 * 569)


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("data.overlap=0", "data.overlap must be a number in (0, 1]"),
        ("data.overlap=1.5", "data.overlap must be a number in (0, 1]"),
        ("data.psi=never", "data.psi must be one of ('auto', 'always')"),
    ],
)
def test_bad_alignment_settings_are_one_error_line(make_cfg, override, words):
    from vfl_lightning.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        train(make_cfg("algo=splitnn", override))
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_party_files_hold_own_rows_and_ids_and_train_on_the_intersection(tmp_path, make_cfg):
    assert export(["data.overlap=0.7", "--out", str(tmp_path / "files")]) == 0
    holdings = simulate_holdings(1797, 0.7, 4, seed=0)
    for m in range(4):
        own = read_party_file(tmp_path / "files", m)
        assert np.array_equal(own.ids, holdings[m])  # its own shuffled order, with its ids
    manifest = json.loads((tmp_path / "files" / "manifest.json").read_text())
    assert manifest["export_settings"]["overlap"] == 0.7
    common = ["algo=pbm", *SHORT]
    from_files = train(make_cfg(*common, "data=party_files", f"data.dir={tmp_path / 'files'}"))
    simulated = train(make_cfg(*common, "data.overlap=0.7"))
    assert from_files["model_digest"] == simulated["model_digest"]
    assert from_files["data/aligned_rows"] == simulated["data/aligned_rows"] == round(0.7 * 1797)
    assert from_files["comm/psi_mb"] == simulated["comm/psi_mb"] > 0
    for key in ("data/split_alpha", "data/split_beta"):  # measured at export, kept in the manifest
        assert from_files[key] == pytest.approx(simulated[key], rel=1e-12)
    files = PartyFilesDataModule(dir=str(tmp_path / "files"))
    assert files.alignment.party_rows == [len(h) for h in holdings]


def test_mismatched_id_columns_are_refused_in_one_line(tmp_path):
    assert export(["data=breast_cancer", "data.num_parties=2", "--out", str(tmp_path / "f")]) == 0
    path = tmp_path / "f" / "party_1.npz"
    with np.load(path) as archive:
        arrays = {key: archive[key] for key in archive.files}
    arrays["ids"] = arrays["ids"].astype(str)
    np.savez(path, **arrays)
    manifest_path = tmp_path / "f" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    from vfl_lightning.data.party_files import sha256_file

    manifest["checksums"]["party_1.npz"] = sha256_file(path)
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="party 1's sample ids are strings, the label holder's"):
        PartyFilesDataModule(dir=str(tmp_path / "f"))


def test_results_and_summary_name_the_alignment(tmp_path):
    cfg = compose_config(tmp_path / "run", "algo=splitnn", "data.overlap=0.8", *SHORT)
    results = train(cfg)
    saved = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert saved["data/aligned_rows"] == round(0.8 * 1797)
    assert saved["data/split_alpha"] > 0 and 0 <= saved["data/split_beta"] <= 1
    from vfl_lightning.run.summary import run_summary

    summary = run_summary(results, tmp_path)
    assert f"  data: {round(0.8 * 1797)} rows held by every party (PSI, " in summary
    assert ", split α " in summary


def test_an_audit_with_the_psi_is_refused_in_one_line(make_cfg):
    from vfl_lightning.errors import ConfigError

    with pytest.raises(ConfigError, match="audit=canary writes its canaries into every") as refused:
        train(make_cfg("algo=pbm", "audit=canary", "data.overlap=0.9", *SHORT))
    assert "\n" not in str(refused.value)


def test_the_alignment_recipe_draws_accuracy_against_the_overlap(tmp_path):
    from conftest import QUIET, run_train_py

    from vfl_lightning.report import ReportError, make_report

    sweep = tmp_path / "sweep"
    run_train_py(
        ["-m", *QUIET, "algo=splitnn", "data=breast_cancer", "data.overlap=0.5,1.0", *SHORT]
        + ["trainer.limit_train_batches=2", "callbacks.checkpoint=null", f"hydra.sweep.dir={sweep}"]
    )
    out = tmp_path / "report"
    files = {p.name for p in make_report([sweep], out, recipe="alignment", progress=False)}
    assert "overlap_acc_vs_overlap.png" in files
    page = (out / "report.md").read_text()
    assert "## Partial overlap: accuracy against the rows the parties share" in page
    rows = [line for line in page.splitlines() if line.startswith("| splitnn |")]
    aligned = [row.split("|")[4].strip() for row in rows]
    assert aligned == [str(round(0.5 * 569)), "569"]
    with pytest.raises(ReportError, match="needs runs of at least two overlaps"):
        make_report([sweep / "0"], tmp_path / "one", recipe="alignment", progress=False)
