"""Party files: one file per party (the rows it holds: their sample ids and only its columns, in its
own order), one for the label holder (ids and labels of every stage of its split), and a manifest;
written by ``python -m vfl_lightning.data.export``, read one holder at a time. The rows the parties
share are found by the PSI before training (:mod:`vfl_lightning.data.alignment`).

Layout of a directory::

    manifest.json   format, dataset, num_parties, party_shapes, party_rows, server_shape,
                    num_classes, split sizes, SHA-256 of every file
    party_<m>.npz   ids (int64 or strings), x (float32, the party's slice shape), its own order
    server.npz      <stage>_ids, <stage>_y (int64); <stage>_x too when the label holder also
                    holds features (an active party)

Plain numpy, no pickle (``allow_pickle=False``): a file can hold arrays and nothing that runs.
The checksums catch corrupted or mixed-up files; the manifest is not signed, so they do not stop
someone who may rewrite the whole directory.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

STAGES = ("train", "val", "test")
FORMAT = "vfl_lightning party files"
VERSION = 2
MANIFEST = "manifest.json"
SERVER_FILE = "server.npz"
CHECKED_SETTINGS = (
    "num_parties",
    "partition",
    "columns",
    "val_fraction",
    "test_fraction",
    "scaling",
    "options",
    "active_party",
    "binary",
    "overlap",
)
"""Data settings that decide the files' content: the manifest records them at export, and a run
that sets one (an experiment config does) must set the recorded value."""


class PartyFilesError(ValueError):
    """A party-files directory that cannot be used: the message names the file and what is wrong."""


def party_file_name(party: int) -> str:
    return f"party_{party}.npz"


@dataclass(frozen=True)
class Manifest:
    """What the manifest promises about the directory's files."""

    dataset: str
    num_parties: int
    party_shapes: list[tuple[int, ...]]
    party_rows: list[int]
    server_shape: tuple[int, ...] | None
    num_classes: int
    split_sizes: dict[str, int]
    checksums: dict[str, str]
    export_settings: dict
    split_scores: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "dataset": self.dataset,
            "num_parties": self.num_parties,
            "party_shapes": [list(s) for s in self.party_shapes],
            "party_rows": list(self.party_rows),
            "server_shape": None if self.server_shape is None else list(self.server_shape),
            "num_classes": self.num_classes,
            "split_sizes": dict(self.split_sizes),
            "checksums": dict(self.checksums),
            "export_settings": dict(self.export_settings),
            "split_scores": {
                k: (v if v is not None and math.isfinite(v) else None)
                for k, v in self.split_scores.items()
            },
        }


@dataclass(frozen=True)
class PartyColumns:
    """One party's part of the data: the sample ids of the rows it holds and their feature
    columns, in its own order."""

    party: int
    shape: tuple[int, ...]
    ids: np.ndarray
    features: np.ndarray


@dataclass(frozen=True)
class ServerPart:
    """The label holder's part: per stage, sample ids and labels (and its own columns, if any)."""

    ids: dict[str, np.ndarray]
    labels: dict[str, np.ndarray]
    features: dict[str, np.ndarray] | None


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- writing
def write_party_files(
    out: Path,
    *,
    dataset: str,
    num_classes: int,
    ids: dict[str, np.ndarray],
    labels: dict[str, np.ndarray],
    party_ids: list[np.ndarray],
    party_features: list[np.ndarray],
    server_features: dict[str, np.ndarray] | None = None,
    export_settings: dict | None = None,
    split_scores: dict | None = None,
) -> Manifest:
    """Write ``party_<m>.npz`` (``party_ids[m]`` and ``party_features[m]``, in that order) for
    every party, ``server.npz`` (the label holder's ``ids``, ``labels`` and own features per
    stage) and the manifest into ``out`` (which must not exist yet, or be empty).
    ``export_settings`` (the data config that made the files) goes into the manifest, for the
    reader to check a run against."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PartyFilesError(f"--out {out} exists and is not an empty directory; choose a new one")
    out.mkdir(parents=True, exist_ok=True)
    stage_ids = {s: _ids(ids[s]) for s in STAGES}
    server = {f"{s}_ids": stage_ids[s] for s in STAGES}
    server |= {f"{s}_y": np.ascontiguousarray(labels[s], dtype=np.int64) for s in STAGES}
    if server_features is not None:
        server |= {f"{s}_x": _float32(server_features[s]) for s in STAGES}
    np.savez(out / SERVER_FILE, **server)
    for m, (own_ids, features) in enumerate(zip(party_ids, party_features, strict=True)):
        np.savez(out / party_file_name(m), ids=_ids(own_ids), x=_float32(features))
    names = [SERVER_FILE] + [party_file_name(m) for m in range(len(party_features))]
    manifest = Manifest(
        dataset=str(dataset),
        num_parties=len(party_features),
        party_shapes=[tuple(int(d) for d in f.shape[1:]) for f in party_features],
        party_rows=[len(f) for f in party_features],
        server_shape=(
            None
            if server_features is None
            else tuple(int(d) for d in server_features["train"].shape[1:])
        ),
        num_classes=int(num_classes),
        split_sizes={s: len(stage_ids[s]) for s in STAGES},
        checksums={name: sha256_file(out / name) for name in names},
        export_settings=dict(export_settings or {}),
        split_scores=dict(split_scores or {}),
    )
    (out / MANIFEST).write_text(json.dumps(manifest.as_json(), indent=2) + "\n")
    return manifest


def _ids(ids) -> np.ndarray:
    """A sample-id column as stored: int64 for integers, fixed-width strings for text."""
    array = np.asarray(ids)
    if array.dtype.kind in "iu":
        return np.ascontiguousarray(array, dtype=np.int64)
    return np.ascontiguousarray(array.astype(str))


def _float32(array) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(array), dtype=np.float32)


# ----------------------------------------------------------------------------- reading
def read_manifest(directory: str | Path) -> Manifest:
    """The directory's manifest, checked for form (not yet against the files)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise PartyFilesError(
            f"data.dir={directory} is not a directory; write one with "
            "python -m vfl_lightning.data.export <overrides> --out DIR"
        )
    path = directory / MANIFEST
    if not path.is_file():
        raise PartyFilesError(f"{path} is missing: {directory} holds no exported party files")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PartyFilesError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise PartyFilesError(f"{path} is not a party-files manifest (format is not {FORMAT!r})")
    if raw.get("version") != VERSION:
        raise PartyFilesError(
            f"{path} has version {raw.get('version')!r}; this reader reads {VERSION} (export the "
            "files again with python -m vfl_lightning.data.export)"
        )
    try:
        num_parties = int(raw["num_parties"])
        manifest = Manifest(
            dataset=str(raw["dataset"]),
            num_parties=num_parties,
            party_shapes=[tuple(int(d) for d in s) for s in raw["party_shapes"]],
            party_rows=[int(n) for n in raw["party_rows"]],
            server_shape=(
                None if raw["server_shape"] is None else tuple(int(d) for d in raw["server_shape"])
            ),
            num_classes=int(raw["num_classes"]),
            split_sizes={s: int(raw["split_sizes"][s]) for s in STAGES},
            checksums={str(k): str(v) for k, v in raw["checksums"].items()},
            export_settings=dict(raw.get("export_settings") or {}),
            split_scores={
                str(k): math.nan if v is None else float(v)
                for k, v in (raw.get("split_scores") or {}).items()
            },
        )
    except (KeyError, TypeError, ValueError) as error:
        raise PartyFilesError(f"{path} lacks or garbles the entry {error}") from error
    if num_parties < 1 or len(manifest.party_shapes) != num_parties:
        raise PartyFilesError(
            f"{path}: num_parties must be >= 1 and match party_shapes "
            f"({len(manifest.party_shapes)} shapes), got {num_parties}"
        )
    if len(manifest.party_rows) != num_parties:
        raise PartyFilesError(
            f"{path}: party_rows must list one row count per party ({num_parties}), got "
            f"{manifest.party_rows}"
        )
    expected = {SERVER_FILE} | {party_file_name(m) for m in range(num_parties)}
    if set(manifest.checksums) != expected:
        raise PartyFilesError(
            f"{path}: checksums must list exactly {sorted(expected)}, got {sorted(manifest.checksums)}"
        )
    return manifest


def check_settings(manifest: Manifest, directory: Path, settings: dict) -> None:
    """Every setting a run gives (not ``None``) must equal the one recorded at export."""
    recorded = manifest.export_settings
    for key, value in settings.items():
        if value is None:
            continue
        if key not in recorded:
            raise PartyFilesError(
                f"data.{key}={value!r} cannot be checked: {directory / MANIFEST} records no "
                f"{key} (export_settings); drop the override with ~data.{key}"
            )
        if value != recorded[key]:
            raise PartyFilesError(
                f"data.{key}={value!r}, but the files in {directory} were exported with "
                f"{key}={recorded[key]!r}; export again with data.{key}={value!r} or drop it"
            )


def _load_checked(directory: Path, name: str, manifest: Manifest) -> dict[str, np.ndarray]:
    """The arrays of file ``name``, after its SHA-256 matched the manifest's."""
    path = directory / name
    if not path.is_file():
        raise PartyFilesError(f"{path} is missing (listed in {directory / MANIFEST})")
    actual = sha256_file(path)
    if actual != manifest.checksums[name]:
        raise PartyFilesError(
            f"{path} has SHA-256 {actual}, but the manifest records {manifest.checksums[name]}: "
            "the file was changed or replaced after export"
        )
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        raise PartyFilesError(f"{path} cannot be read as numpy arrays: {error}") from error


def _stage_array(arrays: dict, path: Path, key: str, dtype, shape: tuple[int, ...]) -> np.ndarray:
    array = arrays.get(key)
    if array is None or array.dtype != dtype or array.shape != shape:
        got = "nothing" if array is None else f"{array.dtype} {array.shape}"
        raise PartyFilesError(f"{path}: {key} must be {np.dtype(dtype)} {shape}, got {got}")
    return array


def _id_column(arrays: dict, path: Path, key: str, size: int) -> np.ndarray:
    """A sample-id column: ``size`` distinct integers (int64) or strings."""
    ids = arrays.get(key)
    if ids is None or ids.shape != (size,) or not (ids.dtype == np.int64 or ids.dtype.kind == "U"):
        got = "nothing" if ids is None else f"{ids.dtype} {ids.shape}"
        raise PartyFilesError(f"{path}: {key} must be {size} int64 or string ids, got {got}")
    if len(np.unique(ids)) != len(ids):
        raise PartyFilesError(f"{path}: {key} repeats a sample id; every row needs its own id")
    return ids


def read_party_file(directory: str | Path, party: int) -> PartyColumns:
    """Party ``party``'s ids and columns: reads the manifest and that party's file, nothing else
    (what a party's process calls)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    if not isinstance(party, (int, np.integer)) or not 0 <= party < manifest.num_parties:
        raise PartyFilesError(
            f"party must be in [0, {manifest.num_parties - 1}] for {directory} "
            f"({manifest.num_parties} parties), got {party!r}"
        )
    name = party_file_name(int(party))
    arrays = _load_checked(directory, name, manifest)
    path, shape = directory / name, manifest.party_shapes[party]
    size = manifest.party_rows[party]
    ids = _id_column(arrays, path, "ids", size)
    features = _stage_array(arrays, path, "x", np.float32, (size, *shape))
    return PartyColumns(party=int(party), shape=shape, ids=ids, features=features)


def read_server_file(directory: str | Path) -> ServerPart:
    """The label holder's ids and labels (and own columns when it holds some): reads the manifest
    and ``server.npz`` only, never a party's file."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    arrays = _load_checked(directory, SERVER_FILE, manifest)
    path = directory / SERVER_FILE
    ids, labels, features = {}, {}, {}
    for stage in STAGES:
        size = manifest.split_sizes[stage]
        ids[stage] = _id_column(arrays, path, f"{stage}_ids", size)
        labels[stage] = _stage_array(arrays, path, f"{stage}_y", np.int64, (size,))
        if size and not (labels[stage].min() >= 0 and labels[stage].max() < manifest.num_classes):
            raise PartyFilesError(
                f"{path}: {stage}_y must lie in [0, {manifest.num_classes - 1}] "
                f"(num_classes {manifest.num_classes}), got [{labels[stage].min()}, "
                f"{labels[stage].max()}]"
            )
        if manifest.server_shape is not None:
            shape = (size, *manifest.server_shape)
            features[stage] = _stage_array(arrays, path, f"{stage}_x", np.float32, shape)
    return ServerPart(ids=ids, labels=labels, features=features or None)
