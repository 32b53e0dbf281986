"""What crosses the process boundary under ``runtime=ray``: the integer dtype a mechanism's ring
elements travel in, and the bytes Ray's serializer makes of a message."""

from __future__ import annotations

import ray
import torch


def wire_dtype(bits: int | None) -> torch.dtype | None:
    """The smallest integer dtype that carries ``bits``-bit ring elements (None: keep float32)."""
    if bits is None:
        return None
    for dtype, width in ((torch.uint8, 8), (torch.int16, 15), (torch.int32, 31)):
        if bits <= width:
            return dtype
    return torch.int64


def serialized_bytes(value) -> int:
    """Bytes Ray's serializer produces for ``value`` (what travels between processes)."""
    context = ray._private.worker.global_worker.get_serialization_context()
    return int(context.serialize(value).total_bytes)
