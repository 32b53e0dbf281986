"""Multi-view datasets of the papers: ModelNet-10 as 12 rendered views (PBM-VFL), Caltech-101's
7-class six-feature set (FedVS's Caltech-7) and NUS-WIDE's image features + tags (FedBCD).

Plain numpy readers. Each dataset carries ``view_sizes`` for the ``views`` partition: feature
columns for tables, channels for ModelNet-10's views (one grey channel per view).
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import numpy as np

from vfl_lightning.data.download import (
    DatasetUnavailableError,
    RemoteFile,
    dataset_folder,
    ensure_file,
    load_or_build,
    verify,
)
from vfl_lightning.data.formats import read_picture
from vfl_lightning.data.raw import RawDataset

# MVCNN's shaded 12-view renderings of ModelNet40 (Su et al.; layout <class>/<train|test>/*.png,
# the 12 views of an object consecutive in name order). No published SHA-256: trust on first use.
MODELNET_TAR = RemoteFile(
    "http://supermoe.cs.umass.edu/shape_recog/shaded_images.tar.gz", "shaded_images.tar.gz"
)
MODELNET10_CLASSES = (
    "bathtub",
    "bed",
    "chair",
    "desk",
    "dresser",
    "monitor",
    "night_stand",
    "sofa",
    "table",
    "toilet",
)
MODELNET_VIEWS = 12
# Caltech-101, 7 classes, six hand-crafted views (Li et al. 2015), as a MATLAB file with X (1 x 6
# cell of N x d) and Y (N x 1). No published SHA-256: trust on first use.
CALTECH7_MAT = RemoteFile(
    "https://raw.githubusercontent.com/ChuanbinZhang/Multi-view-datasets/master/Caltech101-7.mat",
    "Caltech101-7.mat",
)
CALTECH7_VIEWS = {
    "gabor": 48,
    "wavelet_moments": 40,
    "centrist": 254,
    "hog": 1984,
    "gist": 512,
    "lbp": 928,
}
NUS_WIDE_PAGE = "https://lms.comp.nus.edu.sg/research/NUS-WIDE.html"
NUS_WIDE_FEATURES = {"CH": 64, "CORR": 144, "EDH": 73, "WT": 128, "CM55": 225}
NUS_WIDE_TAGS = 1000


def _view_number(name: str) -> tuple[str, int] | None:
    """``<object><sep><view>.png`` -> (object, view): the trailing number is the view."""
    match = re.fullmatch(r"(.*?)(\d+)\.png", name)
    return (match.group(1), int(match.group(2))) if match else None


def _read_modelnet10(archive: Path, size: int) -> dict[str, np.ndarray]:
    """Decode the 10 classes' views from the tarball: x ``(N, 12, size, size)`` uint8 grey."""
    objects: dict[tuple[str, str, str], dict[int, np.ndarray]] = {}
    with tarfile.open(archive, "r:*") as tar:
        for member in tar:
            parts = member.name.split("/")
            if not member.isfile() or len(parts) < 3:
                continue
            label, stage, name = parts[-3:]
            parsed = _view_number(name)
            if label not in MODELNET10_CLASSES or stage not in ("train", "test") or not parsed:
                continue
            data = tar.extractfile(member).read()
            picture = read_picture(data, size, "L", f"{archive}:{member.name}")
            objects.setdefault((stage, label, parsed[0]), {})[parsed[1]] = picture
    if not objects:
        raise ValueError(f"{archive} holds no ModelNet-10 views (<class>/<train|test>/<name>.png)")
    x, y, test = [], [], []
    for (stage, label, key), views in sorted(objects.items()):
        if len(views) != MODELNET_VIEWS:
            raise ValueError(
                f"{archive}: object {label}/{stage}/{key} has {len(views)} views, expected 12"
            )
        x.append(np.concatenate([views[v] for v in sorted(views)]))
        y.append(MODELNET10_CLASSES.index(label))
        test.append(stage == "test")
    order = np.argsort(np.asarray(test), kind="stable")
    return {
        "x": np.stack(x)[order],
        "y": np.asarray(y, dtype=np.int64)[order],
        "test": np.asarray(test)[order],
    }


def load_modelnet10(data_dir: str | None = None, image_size: int = 64) -> RawDataset:
    """ModelNet-10 as MVCNN's 12 shaded views per CAD model (PBM-VFL): 3,991 + 908 objects, 10
    classes, official split. x is ``(N, 12, image_size, image_size)``, one grey channel per view.

    The views are resized to ``image_size`` (bilinear) and cached decoded beside the tarball.
    """
    if not isinstance(image_size, int) or not 8 <= image_size <= 224:
        raise ValueError(
            f"data.options.image_size must be an integer in [8, 224], got {image_size!r}"
        )
    folder = dataset_folder(data_dir, "modelnet10")
    archive = ensure_file(MODELNET_TAR, folder)
    arrays = load_or_build(
        folder / f"modelnet10_{image_size}px.npz", lambda: _read_modelnet10(archive, image_size)
    )
    return RawDataset(
        "modelnet10",
        arrays["x"].astype(np.float32) / np.float32(255.0),
        arrays["y"],
        len(MODELNET10_CLASSES),
        test_index=np.flatnonzero(arrays["test"]),
        view_sizes=[1] * MODELNET_VIEWS,
        is_image=True,
        meta={"classes": list(MODELNET10_CLASSES)},
    )


def load_caltech7(data_dir: str | None = None) -> RawDataset:
    """Caltech-7 (FedVS): 1,474 Caltech-101 images of 7 classes in six views (Gabor 48, wavelet
    moments 40, CENTRIST 254, HOG 1984, GIST 512, LBP 928; 3,766 features), one view per client."""
    from scipy.io import loadmat

    path = ensure_file(CALTECH7_MAT, dataset_folder(data_dir, "caltech7"))
    try:
        contents = loadmat(path)
    except (ValueError, NotImplementedError) as error:
        raise ValueError(f"{path} is not a MATLAB v5 file with X and Y ({error})") from error
    labels = contents.get("Y", contents.get("y"))
    if "X" not in contents or labels is None:
        raise ValueError(f"{path} must hold the variables X (views) and Y (labels)")
    labels = np.asarray(labels).reshape(-1)
    cells = np.asarray(contents["X"]).reshape(-1)
    if len(cells) != len(CALTECH7_VIEWS):
        raise ValueError(f"{path}: X must hold 6 views, got {len(cells)}")
    views = []
    for cell, (view, width) in zip(cells, CALTECH7_VIEWS.items(), strict=True):
        block = np.asarray(cell, dtype=np.float64)
        block = block.T if block.shape == (width, len(labels)) else block
        if block.shape != (len(labels), width):
            raise ValueError(
                f"{path}: view {view} must be {len(labels)} x {width}, got {block.shape}"
            )
        views.append(block)
    classes = np.unique(labels)
    return RawDataset(
        "caltech7",
        np.concatenate(views, axis=1),
        np.searchsorted(classes, labels),
        len(classes),
        view_sizes=list(CALTECH7_VIEWS.values()),
        meta={"views": list(CALTECH7_VIEWS), "label_values": classes.tolist()},
    )


def _nus_file(folder: Path, relative: str) -> Path:
    """A hand-placed NUS-WIDE file, checked against the digest recorded at its first use."""
    path = folder / relative
    if not path.exists():
        raise DatasetUnavailableError(
            f"data=nus_wide needs {path}: download NUS-WIDE's low-level features, tags and "
            f"ground truth from {NUS_WIDE_PAGE} and unpack them into {folder} so that "
            f"{folder}/Low_Level_Features/Train_Normalized_CH.dat, "
            f"{folder}/NUS_WID_Tags/Train_Tags1k.dat and "
            f"{folder}/Groundtruth/TrainTestLabels/Labels_<concept>_Train.txt exist, then run again"
        )
    verify(path, RemoteFile(NUS_WIDE_PAGE, path.name))
    return path


def _nus_table(path: Path, width: int) -> np.ndarray:
    table = np.loadtxt(path, ndmin=2)
    if table.shape[1] != width:
        raise ValueError(f"{path}: expected {width} columns per row, got {table.shape[1]}")
    return table


def _nus_stage(folder: Path, stage: str, labels: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """One official stage: rows with exactly one of ``labels``; features then tags; label index."""
    truth = np.stack(
        [
            _nus_table(_nus_file(folder, f"Groundtruth/TrainTestLabels/Labels_{c}_{stage}.txt"), 1)[
                :, 0
            ]
            for c in labels
        ],
        axis=1,
    )
    keep = truth.sum(axis=1) == 1
    blocks = [
        _nus_table(_nus_file(folder, f"Low_Level_Features/{stage}_Normalized_{kind}.dat"), width)
        for kind, width in NUS_WIDE_FEATURES.items()
    ]
    blocks.append(_nus_table(_nus_file(folder, f"NUS_WID_Tags/{stage}_Tags1k.dat"), NUS_WIDE_TAGS))
    if len({len(block) for block in (truth, *blocks)}) != 1:
        raise ValueError(f"{folder}: the {stage} files do not have the same number of rows")
    x = np.concatenate(blocks, axis=1)[keep]
    return x, truth[keep].argmax(axis=1)


def load_nus_wide(data_dir: str | None = None, labels: list[str] | None = None) -> RawDataset:
    """NUS-WIDE (FedBCD's NUS-FTL): 634 low-level image features (CH 64, CORR 144, EDH 73, WT 128,
    CM55 225) as one view and the 1,000 tag indicators as the other; official train/test split.

    The task: rows whose ground truth has exactly one of the concepts ``labels``; the class is
    that concept's position in ``labels`` (two concepts: a binary task). Files are placed by hand
    (NUS-WIDE is distributed from its project page) under ``<data_dir>/nus_wide``.
    """
    labels = list(labels or ())
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise ValueError(
            f"data.options.labels must list at least two different NUS-WIDE concepts, got {labels}"
        )
    folder = dataset_folder(data_dir, "nus_wide")
    x_train, y_train = _nus_stage(folder, "Train", labels)
    x_test, y_test = _nus_stage(folder, "Test", labels)
    x = np.concatenate([x_train, x_test])
    image_width = sum(NUS_WIDE_FEATURES.values())
    return RawDataset(
        "nus_wide",
        x,
        np.concatenate([y_train, y_test]),
        len(labels),
        test_index=np.arange(len(x_train), len(x)),
        view_sizes=[image_width, NUS_WIDE_TAGS],
        meta={"views": ["image", "tags"], "labels": labels},
    )
