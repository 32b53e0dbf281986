"""Read an offline W&B run file (``run-<id>.wandb``: a 7-byte header, then LevelDB-log blocks of
protobuf ``Record`` messages) so tests check what `wandb sync` would upload."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

BLOCK = 32768
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    """Every ``wandb_internal_pb2.Record`` in the file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, pending, offset = [], b"", HEADER
    while offset + 7 <= len(data):
        if BLOCK - offset % BLOCK < 7:  # a block's tail too short for a header is padding
            offset += BLOCK - offset % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[offset : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            out.append(record)
    return out


def offline_run(run_dir: Path, timeout_s: float = 30.0):
    """The single offline run under ``<run_dir>/wandb``: (RunRecord, records). Waits up to
    ``timeout_s`` for its exit record: under a sweep id, W&B's service writes an offline run's
    file after ``wandb.finish()`` has returned."""
    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    deadline = time.monotonic() + timeout_s
    found = records(path)
    while not any(r.WhichOneof("record_type") == "exit" for r in found):
        assert time.monotonic() < deadline, f"{path} has no exit record after {timeout_s} s"
        time.sleep(0.2)
        found = records(path)
    runs = [r.run for r in found if r.WhichOneof("record_type") == "run"]
    return runs[0], found


def history(found: list) -> list[dict]:
    """Each history row as {key: value}."""
    rows = []
    for record in found:
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {
                    item.key or "/".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
            )
    return rows
