"""Readers for the file formats the datasets ship in: IDX (MNIST family), ARFF, CIFAR pickle
batches, and members of (nested) zip archives. Plain numpy; no pandas."""

from __future__ import annotations

import gzip
import io
import pickle
import zipfile
from pathlib import Path

import numpy as np

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 2
    from numpy.core.multiarray import _reconstruct

IDX_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(data: bytes, source: str = "idx data") -> np.ndarray:
    """Parse an IDX file (gzip-compressed or not): big-endian header, then the array."""
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_DTYPES:
        raise ValueError(f"{source} is not an IDX file (bad magic number {data[:4].hex()})")
    dtype = np.dtype(IDX_DTYPES[data[2]])
    ndim = data[3]
    header = 4 + 4 * ndim
    shape = tuple(int(s) for s in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    count = int(np.prod(shape))
    if len(data) - header != count * dtype.itemsize:
        raise ValueError(
            f"{source}: header says shape {shape} ({count * dtype.itemsize} bytes) but "
            f"{len(data) - header} bytes follow"
        )
    return np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(shape)


def read_arff(text: str, source: str = "ARFF data") -> tuple[list[str], np.ndarray]:
    """Parse a numeric ARFF file (nominal attributes must have numeric values, as in UCI Phishing).

    Returns the attribute names and a float64 array with one column per attribute.
    """
    names: list[str] = []
    data_start = None
    lines = text.splitlines()
    for number, line in enumerate(lines):
        stripped = line.strip()
        lower = stripped.lower()
        if lower.startswith("@attribute"):
            names.append(stripped.split(None, 2)[1].strip("'\""))
        elif lower.startswith("@data"):
            data_start = number + 1
            break
    if data_start is None or not names:
        raise ValueError(f"{source} is not an ARFF file (no @attribute / @data section)")
    rows = [
        line.strip()
        for line in lines[data_start:]
        if line.strip() and not line.lstrip().startswith("%")
    ]
    if any("?" in row for row in rows):
        raise ValueError(f"{source} has missing values ('?'), which this reader does not impute")
    table = np.loadtxt(io.StringIO("\n".join(rows)), delimiter=",", ndmin=2)
    if table.shape[1] != len(names):
        raise ValueError(
            f"{source}: {len(names)} attributes declared but rows have {table.shape[1]} values"
        )
    return names, table


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles plain dicts of numpy arrays and nothing else (no arbitrary code from a file)."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): np.ndarray,
        ("numpy", "dtype"): np.dtype,
        ("_codecs", "encode"): __import__("codecs").encode,
    }

    def find_class(self, module: str, name: str):
        try:
            return self.ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to unpickle {module}.{name}: a dataset batch holds only arrays"
            ) from None


def read_cifar_batch(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR-10 python batch: images ``(n, 3, 32, 32)`` uint8 and labels int64."""
    batch = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
    images = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    labels = np.asarray(batch[b"labels"], dtype=np.int64)
    return images, labels


def read_zip_members(
    archive: Path | bytes, suffixes: list[str], source: str | None = None
) -> dict[str, bytes]:
    """Bytes of the first member ending with each suffix, searching nested zips too."""
    source = source or str(archive)
    handle = io.BytesIO(archive) if isinstance(archive, bytes) else archive
    found: dict[str, bytes] = {}
    with zipfile.ZipFile(handle) as zipped:
        names = [n for n in zipped.namelist() if not n.startswith("__MACOSX/")]
        for suffix in suffixes:
            match = next((n for n in names if n.endswith(suffix)), None)
            if match is not None:
                found[suffix] = zipped.read(match)
        for name in names:
            missing = [s for s in suffixes if s not in found]
            if not missing:
                break
            if name.lower().endswith(".zip"):
                found.update(read_zip_members(zipped.read(name), missing, f"{source}:{name}"))
    return found


def read_zip_member(archive: Path | bytes, suffix: str, source: str | None = None) -> bytes:
    """Bytes of the first member whose name ends with ``suffix`` (nested zips searched too)."""
    found = read_zip_members(archive, [suffix], source)
    if suffix not in found:
        raise FileNotFoundError(f"{source or archive} has no member ending with {suffix!r}")
    return found[suffix]


def read_picture(data: bytes, size: int, mode: str, source: str) -> np.ndarray:
    """A PNG/JPEG image as uint8 ``(C, size, size)``: converted to ``mode`` (``"L"`` grey, ``"RGB"``)
    and resized (bilinear) to ``size`` x ``size``."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            picture = image.convert(mode).resize((size, size), Image.Resampling.BILINEAR)
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"{source} is not a readable image ({error})") from error
    array = np.asarray(picture, dtype=np.uint8)
    return array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
