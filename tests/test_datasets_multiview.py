"""The loaders of ModelNet-10 (12 views), Caltech-7, NUS-WIDE, ImageNet-100 and MIMIC-III, each run
on tiny files written in the real layout (tarball of PNG views, MATLAB cells, NUS-WIDE's .dat and
label files, ImageNet's class folders of JPEGs, the MIMIC-III benchmark's listfiles and time
series); their checksum, cache and one-line offline errors."""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from PIL import Image
from test_datasets_papers import pinned, serve

from vfl_lightning.data import VerticalDataModule, load_dataset, multiview
from vfl_lightning.data.download import ChecksumError, DatasetUnavailableError
from vfl_lightning.data.licensed import MIMIC_CHANNELS, episode_features

RNG = np.random.default_rng(1)


def png(pixels: np.ndarray, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


# ---- ModelNet-10 ------------------------------------------------------------------------------


def modelnet_tarball(objects: dict[tuple[str, str], int], views: int = 12) -> bytes:
    """MVCNN's layout: modelnet40_images_new_12x/<class>/<stage>/<class>_<id>.obj.shaded_v<v>.png."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for (label, stage), count in objects.items():
            for number in range(1, count + 1):
                for view in range(1, views + 1):
                    shade = (view * 20) % 256
                    data = png(np.full((8, 8), shade, dtype=np.uint8))
                    name = f"{label}_{number:04d}.obj.shaded_v{view:03d}.png"
                    info = tarfile.TarInfo(f"modelnet40_images_new_12x/{label}/{stage}/{name}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def test_modelnet10_twelve_views_as_channels_official_split_and_cache(tmp_path, monkeypatch):
    archive = modelnet_tarball(
        {("chair", "train"): 2, ("bed", "train"): 1, ("chair", "test"): 1, ("airplane", "train"): 1}
    )
    monkeypatch.setattr(multiview, "MODELNET_TAR", pinned(multiview.MODELNET_TAR, archive))
    serve(monkeypatch, {multiview.MODELNET_TAR.url: archive})
    raw = load_dataset("modelnet10", str(tmp_path), image_size=8)
    assert raw.x.shape == (4, 12, 8, 8) and raw.num_classes == 10 and raw.is_image
    np.testing.assert_array_equal(raw.y, [1, 2, 2, 2])  # bed, chair, chair | chair (test)
    np.testing.assert_array_equal(raw.test_index, [3])
    np.testing.assert_allclose(raw.x[0, :, 0, 0], [(v * 20) / 255 for v in range(1, 13)], rtol=1e-6)
    assert (tmp_path / "modelnet10" / "modelnet10_8px.npz").exists()
    serve(monkeypatch, {})
    again = load_dataset("modelnet10", str(tmp_path), image_size=8)
    np.testing.assert_array_equal(again.x, raw.x)
    dm = VerticalDataModule(
        "modelnet10",
        6,
        "views",
        data_dir=str(tmp_path),
        val_fraction=0.0,
        options={"image_size": 8},
    )
    assert dm.party_shapes == [(2, 8, 8)] * 6


def test_modelnet10_object_missing_a_view_is_refused(tmp_path, monkeypatch):
    archive = modelnet_tarball({("desk", "train"): 1}, views=11)
    monkeypatch.setattr(multiview, "MODELNET_TAR", pinned(multiview.MODELNET_TAR, archive))
    serve(monkeypatch, {multiview.MODELNET_TAR.url: archive})
    with pytest.raises(ValueError, match="desk/train/desk_0001.obj.shaded_v has 11 views"):
        load_dataset("modelnet10", str(tmp_path), image_size=8)
    with pytest.raises(ValueError, match=r"image_size must be an integer in \[8, 224\], got 4"):
        load_dataset("modelnet10", str(tmp_path), image_size=4)


def test_modelnet10_wrong_checksum_is_one_clear_error(tmp_path, monkeypatch):
    archive = modelnet_tarball({("sofa", "test"): 1})
    monkeypatch.setattr(multiview, "MODELNET_TAR", pinned(multiview.MODELNET_TAR, b"other"))
    serve(monkeypatch, {multiview.MODELNET_TAR.url: archive})
    with pytest.raises(ChecksumError, match="shaded_images.tar.gz has SHA-256 .* expected"):
        load_dataset("modelnet10", str(tmp_path))
    assert list((tmp_path / "modelnet10").iterdir()) == []


# ---- Caltech-7 --------------------------------------------------------------------------------


def caltech_mat(rows: int, transpose_view: int | None = None) -> tuple[bytes, list[np.ndarray]]:
    from scipy.io import savemat

    views = [RNG.normal(size=(rows, w)) for w in multiview.CALTECH7_VIEWS.values()]
    cells = np.empty((1, 6), dtype=object)
    for i, view in enumerate(views):
        cells[0, i] = view.T if i == transpose_view else view
    buffer = io.BytesIO()
    labels = (np.arange(rows) % 7 + 1).reshape(-1, 1).astype(float)
    savemat(buffer, {"X": cells, "Y": labels})
    return buffer.getvalue(), views


def test_caltech7_six_views_one_per_client(tmp_path, monkeypatch):
    data, views = caltech_mat(14, transpose_view=3)
    serve(monkeypatch, {multiview.CALTECH7_MAT.url: data})
    raw = load_dataset("caltech7", str(tmp_path))
    assert raw.x.shape == (14, 3766) and raw.num_classes == 7
    assert raw.view_sizes == [48, 40, 254, 1984, 512, 928]
    np.testing.assert_array_equal(raw.y, np.arange(14) % 7)
    np.testing.assert_allclose(raw.x[:, 342:2326], views[3], rtol=1e-6)
    assert (tmp_path / "caltech7" / "Caltech101-7.mat.sha256").exists()
    dm = VerticalDataModule(
        "caltech7", 6, "views", data_dir=str(tmp_path), test_fraction=0.5, val_fraction=0.0
    )
    assert [s[0] for s in dm.party_shapes] == [48, 40, 254, 1984, 512, 928]


def test_caltech7_with_a_wrong_view_width_names_it(tmp_path, monkeypatch):
    from scipy.io import savemat

    cells = np.empty((1, 6), dtype=object)
    for i, width in enumerate(multiview.CALTECH7_VIEWS.values()):
        cells[0, i] = np.zeros((3, width + (i == 1)))
    buffer = io.BytesIO()
    savemat(buffer, {"X": cells, "Y": np.ones((3, 1))})
    serve(monkeypatch, {multiview.CALTECH7_MAT.url: buffer.getvalue()})
    with pytest.raises(ValueError, match=r"view wavelet_moments must be 3 x 40, got \(3, 41\)"):
        load_dataset("caltech7", str(tmp_path))


# ---- NUS-WIDE ---------------------------------------------------------------------------------


def write_nus_wide(folder, stage: str, truth: dict[str, list[int]]) -> np.ndarray:
    """NUS-WIDE's files: space-separated features (trailing space), tab-separated tags, labels."""
    rows = len(next(iter(truth.values())))
    blocks = []
    for kind, width in multiview.NUS_WIDE_FEATURES.items():
        block = RNG.uniform(0, 1, (rows, width)).round(6)
        path = folder / "Low_Level_Features" / f"{stage}_Normalized_{kind}.dat"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(" ".join(map(str, r)) + " \n" for r in block))
        blocks.append(block)
    tags = RNG.integers(0, 2, (rows, 1000))
    path = folder / "NUS_WID_Tags" / f"{stage}_Tags1k.dat"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join("\t".join(map(str, r)) + "\t\n" for r in tags))
    blocks.append(tags)
    for concept, values in truth.items():
        path = folder / "Groundtruth" / "TrainTestLabels" / f"Labels_{concept}_{stage}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{v}\n" for v in values))
    return np.concatenate(blocks, axis=1)


def test_nus_wide_image_and_tag_views_rows_with_one_concept(tmp_path):
    folder = tmp_path / "nus_wide"
    x_train = write_nus_wide(folder, "Train", {"person": [1, 0, 1, 1], "animal": [0, 1, 1, 0]})
    x_test = write_nus_wide(folder, "Test", {"person": [0, 1, 0], "animal": [1, 0, 0]})
    raw = load_dataset("nus_wide", str(tmp_path), labels=["person", "animal"])
    assert raw.x.shape == (5, 1634) and raw.view_sizes == [634, 1000]
    np.testing.assert_array_equal(raw.y, [0, 1, 0, 1, 0])  # train rows 0, 1, 3; test rows 0, 1
    np.testing.assert_array_equal(raw.test_index, [3, 4])
    np.testing.assert_allclose(raw.x[2], x_train[3], rtol=1e-6)
    np.testing.assert_allclose(raw.x[4], x_test[1], rtol=1e-6)
    assert (folder / "NUS_WID_Tags" / "Train_Tags1k.dat.sha256").exists()
    (folder / "NUS_WID_Tags" / "Train_Tags1k.dat").write_text("0\t1\n")
    with pytest.raises(ChecksumError, match="Train_Tags1k.dat has SHA-256"):
        load_dataset("nus_wide", str(tmp_path), labels=["person", "animal"])


def test_nus_wide_absent_says_what_to_put_where(tmp_path):
    with pytest.raises(DatasetUnavailableError) as caught:
        load_dataset("nus_wide", str(tmp_path), labels=["person", "animal"])
    message = str(caught.value)
    assert multiview.NUS_WIDE_PAGE in message
    assert str(tmp_path / "nus_wide" / "Low_Level_Features" / "Train_Normalized_CH.dat") in message
    with pytest.raises(
        ValueError, match=r"at least two different NUS-WIDE concepts, got \['sky'\]"
    ):
        load_dataset("nus_wide", str(tmp_path), labels=["sky"])


# ---- ImageNet-100 -----------------------------------------------------------------------------


def write_imagenet(folder, per_class: dict[str, tuple[int, int]]) -> None:
    for wnid, (train, val) in per_class.items():
        for stage, count in (("train", train), ("val", val)):
            (folder / stage / wnid).mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = RNG.integers(0, 256, (12, 10, 3), dtype=np.uint8)
                (folder / stage / wnid / f"{wnid}_{i}.JPEG").write_bytes(png(pixels, "JPEG"))


def test_imagenet100_reads_class_folders_val_is_the_test_split(tmp_path):
    folder = tmp_path / "imagenet100"
    write_imagenet(folder, {"n02": (2, 1), "n01": (3, 1)})
    raw = load_dataset("imagenet100", str(tmp_path), image_size=8, num_classes=2)
    assert raw.x.shape == (7, 3, 8, 8) and raw.num_classes == 2 and raw.is_image
    np.testing.assert_array_equal(raw.y, [0, 0, 0, 1, 1, 0, 1])
    np.testing.assert_array_equal(raw.test_index, [5, 6])
    assert raw.meta["classes"] == ["n01", "n02"]
    assert len(list(folder.glob("imagenet100_8px_*.npz"))) == 1
    dm = VerticalDataModule(
        "imagenet100",
        4,
        "quadrants",
        data_dir=str(tmp_path),
        val_fraction=0.0,
        options={"image_size": 8, "num_classes": 2},
    )
    assert dm.party_shapes == [(3, 4, 4)] * 4


@pytest.mark.parametrize(
    ("classes", "problem"),
    [
        ({}, "train does not exist"),
        ({"n01": (1, 1)}, "found 1 class folders, data.options.num_classes is 100"),
        ({"n01": (1, 0)}, "has no images in \\['n01'\\]"),
    ],
)
def test_imagenet100_absent_or_incomplete_says_what_to_put_where(tmp_path, classes, problem):
    folder = tmp_path / "imagenet100"
    write_imagenet(folder, classes)
    with pytest.raises(DatasetUnavailableError, match=problem) as caught:
        load_dataset("imagenet100", str(tmp_path))
    assert f"{folder}/train/<wnid>/*.JPEG" in str(caught.value)
    assert f"{folder}/val/<wnid>/*.JPEG" in str(caught.value)


# ---- MIMIC-III --------------------------------------------------------------------------------


def timeseries(rows: list[tuple[float, dict[str, str]]]) -> str:
    lines = ["Hours," + ",".join(MIMIC_CHANNELS)]
    for hour, values in rows:
        lines.append(",".join([str(hour), *(values.get(c, "") for c in MIMIC_CHANNELS)]))
    return "\n".join(lines) + "\n"


def test_mimic_episode_features_statistics_on_sub_periods():
    text = timeseries(
        [
            (0.0, {"Heart Rate": "80", "Glascow coma scale verbal response": "5 Oriented"}),
            (10.0, {"Heart Rate": "90"}),
            (20.0, {"Heart Rate": "100", "Glascow coma scale verbal response": "Confused"}),
            (40.0, {"Heart Rate": "130"}),
            (50.0, {"Heart Rate": "999"}),  # after the first 48 hours: ignored
        ]
    )
    features = episode_features(text, "stay").reshape(17, 7, 6)
    heart = features[MIMIC_CHANNELS.index("Heart Rate")]
    values = np.array([80.0, 90, 100, 130])
    centred = values - values.mean()
    skew = np.mean(centred**3) / np.mean(centred**2) ** 1.5
    np.testing.assert_allclose(heart[0], [80, 130, 100, values.std(), skew, 4])
    np.testing.assert_allclose(heart[2][[0, 1, 5]], [80, 90, 2])  # first 25 %: hours 0-10
    np.testing.assert_allclose(heart[4][[0, 1, 5]], [130, 130, 1])  # last 10 %: hour 40
    verbal = features[MIMIC_CHANNELS.index("Glascow coma scale verbal response")]
    np.testing.assert_allclose(verbal[0][[0, 1, 5]], [4, 5, 2])
    assert np.isnan(features[MIMIC_CHANNELS.index("pH")]).all()
    with pytest.raises(ValueError, match="Glascow coma scale total has the unknown value '16'"):
        episode_features(timeseries([(1.0, {"Glascow coma scale total": "16"})]), "stay")


def write_mimic(folder, stage: str, stays: dict[str, tuple[int, float]]) -> None:
    base = folder / "in-hospital-mortality" / stage
    base.mkdir(parents=True, exist_ok=True)
    lines = ["stay,y_true"]
    for name, (label, heart) in stays.items():
        lines.append(f"{name},{label}")
        (base / name).write_text(timeseries([(1.0, {"Heart Rate": str(heart)})]))
    (base / "listfile.csv").write_text("\n".join(lines) + "\n")


def test_mimic3_official_split_variables_as_views_imputed_with_training_means(tmp_path):
    folder = tmp_path / "mimic3"
    write_mimic(
        folder, "train", {"1_episode1_timeseries.csv": (0, 80), "2_e_timeseries.csv": (1, 100)}
    )
    write_mimic(folder, "test", {"3_episode1_timeseries.csv": (1, 60)})
    raw = load_dataset("mimic3", str(tmp_path))
    assert raw.x.shape == (3, 714) and raw.view_sizes == [42] * 17 and raw.num_classes == 2
    np.testing.assert_array_equal(raw.y, [0, 1, 1])
    np.testing.assert_array_equal(raw.test_index, [2])
    heart_min = MIMIC_CHANNELS.index("Heart Rate") * 42
    np.testing.assert_allclose(raw.x[:, heart_min], [80, 100, 60])
    assert not np.isnan(raw.x).any()
    write_mimic(folder, "test", {"3_episode1_timeseries.csv": (0, 60)})  # a relabelled copy
    np.testing.assert_array_equal(load_dataset("mimic3", str(tmp_path)).y, [0, 1, 0])
    assert len(list(folder.glob("in-hospital-mortality_features_*.npz"))) == 2
    dm = VerticalDataModule("mimic3", 5, "views", data_dir=str(tmp_path), val_fraction=0.0)
    assert [s[0] for s in dm.party_shapes] == [168, 168, 126, 126, 126]


def test_mimic3_absent_or_incomplete_says_what_to_put_where(tmp_path):
    folder = tmp_path / "mimic3"
    with pytest.raises(DatasetUnavailableError) as caught:
        load_dataset("mimic3", str(tmp_path))
    assert f"{folder}/in-hospital-mortality/" in str(caught.value)
    assert "physionet.org" in str(caught.value)
    write_mimic(folder, "train", {"1_timeseries.csv": (0, 80)})
    write_mimic(folder, "test", {"2_timeseries.csv": (1, 60)})
    (folder / "in-hospital-mortality" / "test" / "2_timeseries.csv").unlink()
    with pytest.raises(
        DatasetUnavailableError, match="1 listed stays are missing, e.g. .*2_timeseries.csv"
    ):
        load_dataset("mimic3", str(tmp_path))


@pytest.mark.parametrize("name", ["modelnet10", "caltech7"])
def test_download_loader_offline_names_url_and_file(tmp_path, monkeypatch, name):
    serve(monkeypatch, {})
    remote = multiview.MODELNET_TAR if name == "modelnet10" else multiview.CALTECH7_MAT
    with pytest.raises(DatasetUnavailableError) as caught:
        load_dataset(name, str(tmp_path))
    assert remote.url in str(caught.value)
    assert str(tmp_path / name / remote.filename) in str(caught.value)
