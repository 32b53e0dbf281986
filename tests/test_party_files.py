"""Party files: export, read back bit for bit, each holder reads only its own file, the server-only
data module holds no feature column, a run from the files equals the run from the dataset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from vfl_lightning.data.export import compose_run_config, main
from vfl_lightning.data.files_datamodule import PartyFilesDataModule
from vfl_lightning.data.party_files import (
    STAGES,
    PartyFilesError,
    party_file_name,
    read_party_file,
    read_server_file,
    sha256_file,
)
from vfl_lightning.errors import ConfigError


def datamodule_of(*overrides: str):
    return instantiate(compose_run_config(list(overrides)).data)


@pytest.fixture(scope="module")
def digits_files(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits_files") / "files"
    assert main(["--out", str(out)]) == 0
    return out


def copy_of(source: Path, target: Path) -> Path:
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).write_bytes(path.read_bytes())
    return target


def test_export_writes_each_party_exactly_its_columns(digits_files):
    original = datamodule_of()
    manifest = json.loads((digits_files / "manifest.json").read_text())
    assert manifest["num_parties"] == 4 and manifest["num_classes"] == 10
    assert manifest["party_shapes"] == [[1, 4, 4]] * 4 and manifest["server_shape"] is None
    assert manifest["party_rows"] == [1797] * 4
    server = read_server_file(digits_files)
    assert server.features is None
    where = {}  # sample id -> (stage, row of the stage)
    for stage in STAGES:
        split = original.splits[stage]
        np.testing.assert_array_equal(server.ids[stage], original.split_index[stage])
        assert np.array_equal(server.labels[stage], split.y.numpy())
        where |= {int(i): (stage, r) for r, i in enumerate(original.split_index[stage])}
    orders = []
    for m in range(4):
        party = read_party_file(digits_files, m)
        assert party.features.dtype == np.float32 and party.ids.dtype == np.int64
        assert sorted(party.ids.tolist()) == list(range(1797))  # every row, its own order
        orders.append(party.ids.tolist())
        for i, row in zip(party.ids.tolist(), party.features, strict=True):
            stage, r = where[i]
            assert row.tobytes() == original.splits[stage].xs[m][r].numpy().tobytes()
    assert len({tuple(o) for o in orders}) == 4
    with np.load(digits_files / party_file_name(2)) as archive:
        assert sorted(archive.files) == ["ids", "x"]


def test_files_datamodule_yields_the_original_batches(digits_files):
    original = datamodule_of()
    from_files = PartyFilesDataModule(dir=str(digits_files))
    assert from_files.party_shapes == original.party_shapes
    assert from_files.num_classes == original.num_classes and from_files.server_shape is None
    for stage in ("train", "val"):
        loaders = (getattr(dm, f"{stage}_dataloader")() for dm in (original, from_files))
        for (xs_a, y_a, idx_a), (xs_b, y_b, idx_b) in zip(*loaders, strict=True):
            assert torch.equal(y_a, y_b) and torch.equal(idx_a, idx_b)
            assert all(torch.equal(a, b) for a, b in zip(xs_a, xs_b, strict=True))


def test_each_holder_reads_only_its_own_file(digits_files, tmp_path):
    alone = copy_of(digits_files, tmp_path / "party1_only")
    for name in ["server.npz"] + [party_file_name(m) for m in (0, 2, 3)]:
        (alone / name).unlink()
    party = read_party_file(alone, 1)
    assert party.party == 1 and party.shape == (1, 4, 4)
    server_only = copy_of(digits_files, tmp_path / "server_only")
    for m in range(4):
        (server_only / party_file_name(m)).unlink()
    datamodule = PartyFilesDataModule(dir=str(server_only), party_columns=False)
    assert datamodule.party_shapes == [(1, 4, 4)] * 4
    # no party column and no party's ids here: only the label holder's, awaiting the PSI
    assert datamodule.splits == {} and datamodule.party_tables == []
    assert sum(len(ids) for ids in datamodule.label_holder_ids.values()) == 1797
    assert datamodule.pending.own is None


def test_an_active_label_holder_keeps_its_own_slice_in_the_server_file(tmp_path):
    overrides = ["data=breast_cancer", "data.num_parties=3", "data.active_party=true"]
    assert main([*overrides, "--out", str(tmp_path / "files")]) == 0
    original = datamodule_of(*overrides)
    assert not (tmp_path / "files" / party_file_name(2)).exists()
    full = PartyFilesDataModule(dir=str(tmp_path / "files"))
    server_only = PartyFilesDataModule(dir=str(tmp_path / "files"), party_columns=False)
    assert full.party_shapes == original.party_shapes == server_only.party_shapes
    assert full.server_shape == original.server_shape == (10,)
    for stage in STAGES:
        for a, b in zip(full.splits[stage].xs, original.splits[stage].xs, strict=True):
            assert torch.equal(a, b)
        own = server_only.pending.own[stage]
        assert torch.equal(torch.from_numpy(own), original.splits[stage].xs[-1])


def test_a_run_from_party_files_has_the_original_model_digest(digits_files, make_cfg):
    from vfl_lightning.train import train

    common = ["algo=pbm", "seed=0", "trainer.max_epochs=1", "test=false"]
    original = train(make_cfg(*common))
    from_files = train(make_cfg(*common, "data=party_files", f"data.dir={digits_files}"))
    assert from_files["model_digest"] == original["model_digest"]
    assert from_files["data"] == "party_files"


def test_fedvs_trains_on_segmented_batches_from_party_files(tmp_path, make_cfg):
    from vfl_lightning.train import train

    assert main(["experiment=fedvs_digits", "--out", str(tmp_path / "files")]) == 0
    common = ["experiment=fedvs_digits", "trainer.max_epochs=1", "trainer.limit_train_batches=4"]
    common += ["trainer.limit_val_batches=1", "test=false"]
    original = train(make_cfg(*common))
    segmented = "vfl_lightning.data.files_datamodule.SegmentedPartyFilesDataModule"
    files = ["data=party_files", f"data.dir={tmp_path / 'files'}", f"data._target_={segmented}"]
    assert train(make_cfg(*common, *files))["model_digest"] == original["model_digest"]
    # without data._target_, one line naming it and the data module that reads the files
    with pytest.raises(ConfigError) as refused:
        train(make_cfg(*common, *files[:2]))
    assert str(refused.value) == (
        "data=party_files sets data.dir, which data._target_=vfl_lightning.data.segments."
        "SegmentedDataModule does not take (set by algo=fedvs, experiment=fedvs_digits): read the "
        f"party files in that form with data._target_={segmented}"
    )


# ----------------------------------------------------------------------------- bad inputs
def one_line_error(call, *words: str) -> str:
    with pytest.raises(PartyFilesError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    for word in words:
        assert word in message, message
    return message


def test_a_missing_dir_or_manifest_is_named(tmp_path):
    one_line_error(lambda: PartyFilesDataModule(dir=str(tmp_path / "nowhere")), "nowhere", "export")
    one_line_error(lambda: read_party_file(tmp_path, 0), "manifest.json is missing")
    one_line_error(lambda: PartyFilesDataModule(dir=None), "needs data.dir=DIR")
    one_line_error(lambda: PartyFilesDataModule(dir=str(tmp_path), batch_size=0), "got 0")


def test_a_wrong_manifest_is_named(digits_files, tmp_path):
    files = copy_of(digits_files, tmp_path / "files")
    manifest_path = files / "manifest.json"
    good = json.loads(manifest_path.read_text())
    cases = [
        ({**good, "format": "something else"}, "not a party-files manifest"),
        ({**good, "version": 7}, "version 7"),
        ({**good, "num_parties": 3}, "num_parties must be >= 1 and match party_shapes"),
        ({k: v for k, v in good.items() if k != "num_classes"}, "'num_classes'"),
        ({**good, "checksums": {"server.npz": "0"}}, "checksums must list exactly"),
    ]
    for manifest, words in cases:
        manifest_path.write_text(json.dumps(manifest))
        one_line_error(lambda: PartyFilesDataModule(dir=str(files)), words)
    manifest_path.write_text("{not json")
    one_line_error(lambda: read_server_file(files), "is not valid JSON")


def test_a_setting_that_differs_from_the_export_is_named(digits_files, tmp_path):
    one_line_error(
        lambda: PartyFilesDataModule(dir=str(digits_files), num_parties=8, partition="quadrants"),
        "data.num_parties=8, but the files in",
        "exported with num_parties=4",
    )
    one_line_error(
        lambda: PartyFilesDataModule(dir=str(digits_files), partition="strips"),
        "exported with partition='quadrants'",
    )
    assert PartyFilesDataModule(dir=str(digits_files), num_parties=4, binary=False).num_parties == 4
    files = copy_of(digits_files, tmp_path / "files")
    manifest = json.loads((files / "manifest.json").read_text())
    del manifest["export_settings"]
    (files / "manifest.json").write_text(json.dumps(manifest))
    one_line_error(
        lambda: PartyFilesDataModule(dir=str(files), scaling="none"),
        "records no scaling",
        "~data.scaling",
    )


def test_a_tampered_file_is_refused_by_its_checksum(digits_files, tmp_path):
    files = copy_of(digits_files, tmp_path / "files")
    data = bytearray((files / party_file_name(1)).read_bytes())
    data[-200] ^= 1
    (files / party_file_name(1)).write_bytes(bytes(data))
    one_line_error(lambda: read_party_file(files, 1), "party_1.npz has SHA-256", "changed")
    read_party_file(files, 0)
    one_line_error(lambda: PartyFilesDataModule(dir=str(files)), "party_1.npz")
    (files / party_file_name(3)).unlink()
    one_line_error(lambda: read_party_file(files, 3), "party_3.npz is missing")


def test_a_party_index_out_of_range_is_named(digits_files):
    for bad in (-1, 4, 1.5):
        one_line_error(lambda bad=bad: read_party_file(digits_files, bad), "[0, 3]", repr(bad))


def test_repeated_ids_bad_labels_and_bad_columns_are_named(digits_files, tmp_path):
    files = copy_of(digits_files, tmp_path / "files")

    def rewrite(name: str, change) -> None:
        with np.load(files / name) as archive:
            arrays = {k: archive[k] for k in archive.files}
        change(arrays)
        np.savez(files / name, **arrays)
        manifest = json.loads((files / "manifest.json").read_text())
        manifest["checksums"][name] = sha256_file(files / name)
        (files / "manifest.json").write_text(json.dumps(manifest))

    rewrite(party_file_name(2), lambda a: a["ids"].__setitem__(1, a["ids"][0]))
    one_line_error(lambda: PartyFilesDataModule(dir=str(files)), "party_2.npz", "repeats")
    rewrite("server.npz", lambda a: a["test_y"].__setitem__(0, 10))
    one_line_error(lambda: read_server_file(files), "test_y must lie in [0, 9]", "10]")
    rewrite(party_file_name(0), lambda a: a.update(x=a["x"].astype(np.float64)))
    one_line_error(lambda: read_party_file(files, 0), "x must be float32", "float64")


def test_export_refuses_a_used_out_dir_and_party_files_input(digits_files, capsys):
    assert main(["--out", str(digits_files)]) == 2
    assert "is not an empty directory" in capsys.readouterr().err
    code = main(["data=party_files", f"data.dir={digits_files}", "--out", "/tmp/unused_i22"])
    line = capsys.readouterr().err.strip()
    assert (
        code == 2 and line.startswith("error: export needs a dataset config") and "\n" not in line
    )
