"""Read an offline W&B run file (``run-<id>.wandb``: a 7-byte header, then LevelDB-log blocks of
protobuf ``Record`` messages) so tests check what `wandb sync` would upload."""

from __future__ import annotations

import json
import struct
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


def offline_run(run_dir: Path):
    """The single offline run under ``<run_dir>/wandb``: (RunRecord, records)."""
    (path,) = Path(run_dir).glob("wandb/offline-run-*/run-*.wandb")
    found = records(path)
    runs = [r.run for r in found if r.WhichOneof("record_type") == "run"]
    return runs[0], found


def history(found: list) -> list[dict]:
    """Each history row as {key: value}."""
    rows = []
    for record in found:
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows
