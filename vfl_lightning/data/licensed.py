"""Licensed datasets of the papers, read from the user's own copy: ImageNet-100 (PBM-VFL) and
MIMIC-III's in-hospital-mortality task (FedBCD's MIMIC-LR). Nothing is downloaded.

Decoding thousands of files is slow, so the arrays are built once and cached beside the copy,
under a name that carries the SHA-256 of the copy's file listing (paths and sizes): a changed copy
gets a fresh cache.
"""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

import numpy as np

from vfl_lightning.data.download import DatasetUnavailableError, dataset_folder, load_or_build
from vfl_lightning.data.formats import read_picture
from vfl_lightning.data.raw import RawDataset

IMAGENET_SUFFIXES = (".jpeg", ".jpg", ".png")
MIMIC_TASK = "in-hospital-mortality"
MIMIC_HOURS = 48.0
# The 17 clinical variables of the MIMIC-III benchmark (Harutyunyan et al. 2019), in its order.
MIMIC_CHANNELS = (
    "Capillary refill rate",
    "Diastolic blood pressure",
    "Fraction inspired oxygen",
    "Glascow coma scale eye opening",
    "Glascow coma scale motor response",
    "Glascow coma scale total",
    "Glascow coma scale verbal response",
    "Glucose",
    "Heart Rate",
    "Height",
    "Mean blood pressure",
    "Oxygen saturation",
    "Respiratory rate",
    "Systolic blood pressure",
    "Temperature",
    "Weight",
    "pH",
)
# The benchmark's numeric codes of the categorical variables' recorded values.
_EYE = {"None": 0, "1 No Response": 1, "2 To pain": 2, "To Pain": 2, "3 To speech": 3}
_EYE |= {"To Speech": 3, "4 Spontaneously": 4, "Spontaneously": 4}
_MOTOR = {"1 No Response": 1, "No response": 1, "2 Abnorm extensn": 2, "Abnormal extension": 2}
_MOTOR |= {"3 Abnorm flexion": 3, "Abnormal Flexion": 3, "4 Flex-withdraws": 4}
_MOTOR |= {"Flex-withdraws": 4, "5 Localizes Pain": 5, "Localizes Pain": 5}
_MOTOR |= {"6 Obeys Commands": 6, "Obeys Commands": 6}
_VERBAL = {"No Response-ETT": 1, "No Response": 1, "1 No Response": 1, "1.0 ET/Trach": 1}
_VERBAL |= {"2 Incomp sounds": 2, "Incomprehensible sounds": 2, "3 Inapprop words": 3}
_VERBAL |= {"Inappropriate Words": 3, "4 Confused": 4, "Confused": 4, "5 Oriented": 5}
_VERBAL |= {"Oriented": 5}
MIMIC_CODES = {
    "Capillary refill rate": {"0.0": 0, "1.0": 1},
    "Glascow coma scale eye opening": _EYE,
    "Glascow coma scale motor response": _MOTOR,
    "Glascow coma scale total": {str(v): v for v in range(3, 16)},
    "Glascow coma scale verbal response": _VERBAL,
}
# Sub-periods of each variable's recorded span: first 100/10/25/50 %, last 10/25/50 %.
MIMIC_SUBPERIODS = (("first", 100), ("first", 10), ("first", 25), ("first", 50))
MIMIC_SUBPERIODS += (("last", 10), ("last", 25), ("last", 50))
MIMIC_STATISTICS = ("min", "max", "mean", "std", "skew", "count")


def listing_digest(paths: list[Path], root: Path, read: tuple[Path, ...] = ()) -> str:
    """SHA-256 of the sorted relative paths and sizes of ``paths`` and of the contents of the small
    files ``read`` (names a copy's cache)."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(f"{path.relative_to(root)}\t{path.stat().st_size}\n".encode())
    for path in read:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _imagenet_missing(folder: Path, problem: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"data=imagenet100 reads your own copy of ImageNet-100 (100 classes of ILSVRC-2012, "
        f"licensed from https://www.image-net.org/): {problem}. Put the training images at "
        f"{folder}/train/<wnid>/*.JPEG and the validation images at {folder}/val/<wnid>/*.JPEG "
        "(one folder per class, the same class folders in both), then run again"
    )


def _imagenet_files(folder: Path) -> dict[str, dict[str, list[Path]]]:
    files: dict[str, dict[str, list[Path]]] = {}
    for stage in ("train", "val"):
        if not (folder / stage).is_dir():
            raise _imagenet_missing(folder, f"{folder / stage} does not exist")
        classes = sorted(p for p in (folder / stage).iterdir() if p.is_dir())
        files[stage] = {
            c.name: sorted(p for p in c.iterdir() if p.suffix.lower() in IMAGENET_SUFFIXES)
            for c in classes
        }
        empty = [name for name, paths in files[stage].items() if not paths]
        if not files[stage] or empty:
            raise _imagenet_missing(folder, f"{folder / stage} has no images in {empty or 'it'}")
    if sorted(files["train"]) != sorted(files["val"]):
        raise _imagenet_missing(folder, "train/ and val/ hold different class folders")
    return files


def load_imagenet100(
    data_dir: str | None = None, image_size: int = 64, num_classes: int = 100
) -> RawDataset:
    """ImageNet-100 from the user's copy: ``train/<wnid>/`` and ``val/<wnid>/`` (the official
    validation images are the test split). Images are resized to ``image_size`` square (bilinear),
    RGB, x ``(N, 3, image_size, image_size)``; classes are the sorted wnids."""
    if not isinstance(image_size, int) or not 8 <= image_size <= 224:
        raise ValueError(
            f"data.options.image_size must be an integer in [8, 224], got {image_size!r}"
        )
    folder = dataset_folder(data_dir, "imagenet100")
    files = _imagenet_files(folder)
    if len(files["train"]) != num_classes:
        raise _imagenet_missing(
            folder,
            f"found {len(files['train'])} class folders, data.options.num_classes is {num_classes}",
        )
    wnids = sorted(files["train"])
    every = [p for stage in files.values() for paths in stage.values() for p in paths]
    digest = listing_digest(every, folder)[:16]

    def build() -> dict[str, np.ndarray]:
        x, y, test = [], [], []
        for stage in ("train", "val"):
            for label, wnid in enumerate(wnids):
                for path in files[stage][wnid]:
                    x.append(read_picture(path.read_bytes(), image_size, "RGB", str(path)))
                    y.append(label)
                    test.append(stage == "val")
        return {"x": np.stack(x), "y": np.asarray(y), "test": np.asarray(test)}

    arrays = load_or_build(folder / f"imagenet100_{image_size}px_{digest}.npz", build)
    return RawDataset(
        "imagenet100",
        arrays["x"].astype(np.float32) / np.float32(255.0),
        arrays["y"],
        num_classes,
        test_index=np.flatnonzero(arrays["test"]),
        is_image=True,
        meta={"classes": wnids},
    )


def _statistics(values: np.ndarray) -> list[float]:
    """min, max, mean, population std, biased skewness (NaN for constant values, as scipy's
    ``skew``) and count of ``values``; all NaN for none."""
    if len(values) == 0:
        return [np.nan] * len(MIMIC_STATISTICS)
    centred = values - values.mean()
    second, third = np.mean(centred**2), np.mean(centred**3)
    skewness = third / second**1.5 if second > 1e-12 * max(1.0, values.mean() ** 2) else np.nan
    return [values.min(), values.max(), values.mean(), np.sqrt(second), skewness, len(values)]


def episode_features(text: str, source: str) -> np.ndarray:
    """The 714 features of one ICU stay's ``*_timeseries.csv`` (first 48 hours): for each of the
    17 variables, 6 statistics on 7 sub-periods of the span of its recorded values (NaN where a
    sub-period holds no value), in the order variable, sub-period, statistic."""
    rows = list(csv.reader(io.StringIO(text)))
    header = rows[0] if rows else []
    if not header or header[0] != "Hours" or sorted(header[1:]) != sorted(MIMIC_CHANNELS):
        raise ValueError(f"{source}: the header must be Hours and the 17 benchmark variables")
    column = {name: i for i, name in enumerate(header)}
    features = []
    for channel in MIMIC_CHANNELS:
        codes = MIMIC_CODES.get(channel)
        series = []
        for row in rows[1:]:
            hour, raw = float(row[0]), row[column[channel]]
            if raw == "" or hour > MIMIC_HOURS + 1e-6:
                continue
            if codes is not None and raw not in codes:
                raise ValueError(f"{source}: {channel} has the unknown value {raw!r}")
            series.append((hour, codes[raw] if codes is not None else float(raw)))
        times = np.asarray([t for t, _ in series])
        values = np.asarray([v for _, v in series], dtype=np.float64)
        first, last = (times[0], times[-1]) if len(times) else (0.0, 0.0)
        for side, percent in MIMIC_SUBPERIODS:
            span = (last - first) * percent / 100.0
            low, high = (first, first + span) if side == "first" else (last - span, last)
            inside = (times > low - 1e-6) & (times < high + 1e-6)
            features.extend(_statistics(values[inside]))
    return np.asarray(features, dtype=np.float64)


def _mimic_missing(folder: Path, problem: str) -> DatasetUnavailableError:
    return DatasetUnavailableError(
        f"data=mimic3 reads your own copy of MIMIC-III (credentialed access at "
        f"https://physionet.org/content/mimiciii/) turned into the in-hospital-mortality task by "
        f"the MIMIC-III benchmark scripts (github.com/YerevaNN/mimic3-benchmarks): {problem}. Put "
        f"their output data/{MIMIC_TASK}/ at {folder}/{MIMIC_TASK}/, i.e. train/listfile.csv, "
        "test/listfile.csv and each listed stay's *_timeseries.csv beside them, then run again"
    )


def _mimic_listfile(folder: Path, stage: str) -> list[tuple[str, int]]:
    path = folder / MIMIC_TASK / stage / "listfile.csv"
    if not path.exists():
        raise _mimic_missing(folder, f"{path} does not exist")
    rows = list(csv.DictReader(io.StringIO(path.read_text())))
    if not rows or not {"stay", "y_true"} <= set(rows[0]):
        raise ValueError(f"{path}: expected the columns stay and y_true")
    return [(row["stay"], int(row["y_true"])) for row in rows]


def load_mimic3(data_dir: str | None = None) -> RawDataset:
    """MIMIC-III in-hospital mortality (FedBCD's MIMIC-LR): 17,903 + 3,236 ICU stays, the
    benchmark's 714 hand-crafted features of the first 48 hours, label 1 = died in hospital.

    The official train (the benchmark's train + validation stays) and test split is kept. Missing
    features are imputed with the mean of the training stays. ``view_sizes`` groups the 42
    features of each of the 17 variables (the ``views`` partition gives parties whole variables).
    """
    folder = dataset_folder(data_dir, "mimic3")
    stays = {stage: _mimic_listfile(folder, stage) for stage in ("train", "test")}
    paths = [folder / MIMIC_TASK / stage / name for stage in stays for name, _ in stays[stage]]
    absent = [p for p in paths if not p.exists()]
    if absent:
        raise _mimic_missing(folder, f"{len(absent)} listed stays are missing, e.g. {absent[0]}")
    listfiles = tuple(folder / MIMIC_TASK / stage / "listfile.csv" for stage in stays)
    digest = listing_digest(paths, folder, read=listfiles)[:16]

    def build() -> dict[str, np.ndarray]:
        x = np.stack([episode_features(p.read_text(), str(p)) for p in paths])
        return {"x": x, "y": np.asarray([y for stage in stays.values() for _, y in stage])}

    arrays = load_or_build(folder / f"{MIMIC_TASK}_features_{digest}.npz", build)
    x, num_train = arrays["x"], len(stays["train"])
    seen = ~np.isnan(x[:num_train])
    means = np.nansum(x[:num_train], axis=0) / np.maximum(seen.sum(axis=0), 1)
    x = np.where(np.isnan(x), means, x)
    per_variable = len(MIMIC_SUBPERIODS) * len(MIMIC_STATISTICS)
    return RawDataset(
        "mimic3",
        x,
        arrays["y"],
        2,
        test_index=np.arange(num_train, len(x)),
        view_sizes=[per_variable] * len(MIMIC_CHANNELS),
        meta={"views": list(MIMIC_CHANNELS)},
    )
