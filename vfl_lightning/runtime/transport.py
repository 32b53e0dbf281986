"""What crosses the process boundary under ``runtime=ray``: the integer dtype a mechanism's ring
elements travel in, and the bytes Ray's serializer makes of a message."""

from __future__ import annotations

import functools

import numpy as np
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


def array_bytes(array: np.ndarray) -> int:
    """Bytes Ray's serializer produces for the contiguous array ``array``: they depend on its
    shape and dtype only (the data travels as one out-of-band buffer), so they are measured once
    per shape and dtype."""
    if not array.flags.c_contiguous:
        return serialized_bytes(array)
    return _array_bytes(array.shape, array.dtype.str)


@functools.cache
def _array_bytes(shape: tuple, dtype: str) -> int:
    return serialized_bytes(np.zeros(shape, dtype))


def blob_bytes(blob: bytes) -> int:
    """Bytes Ray's serializer produces for the byte string ``blob``: they depend on its length
    only, so they are measured once per length."""
    return _blob_bytes(len(blob))


@functools.cache
def _blob_bytes(length: int) -> int:
    return serialized_bytes(bytes(length))
