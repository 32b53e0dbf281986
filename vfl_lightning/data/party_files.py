"""Party files: one file per party (its sample ids and only its columns), one for the server (ids and
labels), and a manifest; written by ``python -m vfl_lightning.data.export``, read one holder at a time.

Layout of a directory::

    manifest.json   format, dataset, num_parties, party_shapes, server_shape, num_classes,
                    split sizes, SHA-256 of every file
    party_<m>.npz   <stage>_ids (int64), <stage>_x (float32, the party's slice shape) per stage
    server.npz      <stage>_ids, <stage>_y (int64); <stage>_x too when the label holder also
                    holds features (an active party)

Plain numpy, no pickle (``allow_pickle=False``): a file can hold arrays and nothing that runs.
The checksums catch corrupted or mixed-up files; the manifest is not signed, so they do not stop
someone who may rewrite the whole directory.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STAGES = ("train", "val", "test")
FORMAT = "vfl_lightning party files"
VERSION = 1
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
    server_shape: tuple[int, ...] | None
    num_classes: int
    split_sizes: dict[str, int]
    checksums: dict[str, str]
    export_settings: dict

    def as_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "dataset": self.dataset,
            "num_parties": self.num_parties,
            "party_shapes": [list(s) for s in self.party_shapes],
            "server_shape": None if self.server_shape is None else list(self.server_shape),
            "num_classes": self.num_classes,
            "split_sizes": dict(self.split_sizes),
            "checksums": dict(self.checksums),
            "export_settings": dict(self.export_settings),
        }


@dataclass(frozen=True)
class PartyColumns:
    """One party's part of the data: per stage, its sample ids and its feature columns."""

    party: int
    shape: tuple[int, ...]
    ids: dict[str, np.ndarray]
    features: dict[str, np.ndarray]


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
    party_features: list[dict[str, np.ndarray]],
    server_features: dict[str, np.ndarray] | None = None,
    export_settings: dict | None = None,
) -> Manifest:
    """Write ``party_<m>.npz`` for every entry of ``party_features``, ``server.npz`` and the
    manifest into ``out`` (which must not exist yet, or be empty). ``export_settings`` (the data
    config that made the files) goes into the manifest, for the reader to check a run against."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise PartyFilesError(f"--out {out} exists and is not an empty directory; choose a new one")
    out.mkdir(parents=True, exist_ok=True)
    stage_ids = {s: np.ascontiguousarray(ids[s], dtype=np.int64) for s in STAGES}
    server = {f"{s}_ids": stage_ids[s] for s in STAGES}
    server |= {f"{s}_y": np.ascontiguousarray(labels[s], dtype=np.int64) for s in STAGES}
    if server_features is not None:
        server |= {f"{s}_x": _float32(server_features[s]) for s in STAGES}
    np.savez(out / SERVER_FILE, **server)
    for m, features in enumerate(party_features):
        arrays = {f"{s}_ids": stage_ids[s] for s in STAGES}
        arrays |= {f"{s}_x": _float32(features[s]) for s in STAGES}
        np.savez(out / party_file_name(m), **arrays)
    names = [SERVER_FILE] + [party_file_name(m) for m in range(len(party_features))]
    manifest = Manifest(
        dataset=str(dataset),
        num_parties=len(party_features),
        party_shapes=[tuple(int(d) for d in f["train"].shape[1:]) for f in party_features],
        server_shape=(
            None
            if server_features is None
            else tuple(int(d) for d in server_features["train"].shape[1:])
        ),
        num_classes=int(num_classes),
        split_sizes={s: len(stage_ids[s]) for s in STAGES},
        checksums={name: sha256_file(out / name) for name in names},
        export_settings=dict(export_settings or {}),
    )
    (out / MANIFEST).write_text(json.dumps(manifest.as_json(), indent=2) + "\n")
    return manifest


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
            f"{path} has version {raw.get('version')!r}; this reader reads {VERSION}"
        )
    try:
        num_parties = int(raw["num_parties"])
        manifest = Manifest(
            dataset=str(raw["dataset"]),
            num_parties=num_parties,
            party_shapes=[tuple(int(d) for d in s) for s in raw["party_shapes"]],
            server_shape=(
                None if raw["server_shape"] is None else tuple(int(d) for d in raw["server_shape"])
            ),
            num_classes=int(raw["num_classes"]),
            split_sizes={s: int(raw["split_sizes"][s]) for s in STAGES},
            checksums={str(k): str(v) for k, v in raw["checksums"].items()},
            export_settings=dict(raw.get("export_settings") or {}),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise PartyFilesError(f"{path} lacks or garbles the entry {error}") from error
    if num_parties < 1 or len(manifest.party_shapes) != num_parties:
        raise PartyFilesError(
            f"{path}: num_parties must be >= 1 and match party_shapes "
            f"({len(manifest.party_shapes)} shapes), got {num_parties}"
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


def _check_ids(ids: np.ndarray, path: Path, stage: str) -> None:
    if len(np.unique(ids)) != len(ids):
        raise PartyFilesError(f"{path}: {stage}_ids repeats a sample id")


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
    ids, features = {}, {}
    for stage in STAGES:
        size = manifest.split_sizes[stage]
        ids[stage] = _stage_array(arrays, path, f"{stage}_ids", np.int64, (size,))
        _check_ids(ids[stage], path, stage)
        features[stage] = _stage_array(arrays, path, f"{stage}_x", np.float32, (size, *shape))
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
        ids[stage] = _stage_array(arrays, path, f"{stage}_ids", np.int64, (size,))
        _check_ids(ids[stage], path, stage)
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


def check_aligned(server: ServerPart, party: PartyColumns, directory: Path) -> None:
    """Party ``party``'s rows must be the server's samples in the server's order."""
    for stage in STAGES:
        if not np.array_equal(server.ids[stage], party.ids[stage]):
            raise PartyFilesError(
                f"{directory / party_file_name(party.party)}: its {stage}_ids differ from "
                f"{SERVER_FILE}'s; every file must list the same samples in the same order"
            )
