"""Files a reader sees whole or not at all: the atomic write every checkpoint, curve and results
file goes through, the cleanup of what a killed writer left, and results.json's strict JSON.
Standard library only (the command line writes a refused run's results.json before torch)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import tempfile
from pathlib import Path

TEMPORARY_SUFFIX = ".partial"
TEMPORARY_NAME = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TEMPORARY_SUFFIX))
"""The name of an :func:`atomic_write_bytes` temporary file: ``.<target>.<8 random>.partial``."""


def atomic_write_bytes(data: bytes, path: str | os.PathLike, *, durable: bool = True) -> None:
    """Write ``data`` into a temporary file in ``path``'s own directory, flush it to disk, then
    ``os.replace`` it onto ``path``: a reader sees the old file or the complete new one, never a
    partial one (a temporary file on another filesystem would need a non-atomic copy).
    ``durable=False`` skips the two ``fsync`` calls (the file's and its directory's): the write is
    still atomic for readers and survives the writer's death (kill -9), but not a crash of the
    machine itself.

    The writer holds an exclusive ``flock`` on the temporary file until it is renamed, so a file
    left by a killed writer (the kernel drops the lock with the process) can be told from one being
    written: :func:`remove_stale_temporaries`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(
        prefix=f".{target.name}.", suffix=TEMPORARY_SUFFIX, dir=target.parent
    )
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        with os.fdopen(os.dup(handle), "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    finally:
        os.close(handle)
    if not durable:
        return
    directory = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete the temporary files that killed :func:`atomic_write_bytes` calls left in
    ``directory`` (a ``kill -9`` between the write and the rename): only files named like ours
    whose lock no process holds, so a write in progress (this process's or another's) is kept.
    Returns the paths removed."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    removed = []
    for path in sorted(folder.iterdir()):
        if not TEMPORARY_NAME.fullmatch(path.name) or path.is_symlink() or not path.is_file():
            continue
        try:
            handle = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            path.unlink(missing_ok=True)
            removed.append(path)
        except BlockingIOError:
            continue
        finally:
            os.close(handle)
    return removed


def strict_json(value):
    """``value`` with every non-finite float replaced by None (strict JSON has no NaN/Infinity)."""
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_results(path: Path, results: dict) -> None:
    """results.json, strict JSON, replaced atomically."""
    text = json.dumps(strict_json(results), indent=2, sort_keys=True, allow_nan=False)
    atomic_write_bytes(text.encode(), path)


def unwritable(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be made (``mkdir -p``) and written, or None: the folders it lacks are
    made and removed again, so nothing is left behind."""
    made = []
    path = Path(path).absolute()
    try:
        for folder in reversed([path, *path.parents]):
            if not folder.exists():
                folder.mkdir()
                made.append(folder)
        if not path.is_dir():
            return f"{path} is a file, not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return f"{path} is not writable"
    except OSError as error:
        return " ".join(str(error).split())
    finally:
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()
    return None
