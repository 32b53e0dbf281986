"""Messages between organizations as bytes, without pickle: a frame holds the fields of a fixed
schema, in the schema's order, each a scalar, a string, bytes, JSON text, a tensor (raw
little-endian bytes with its dtype and shape), a tensor of ring elements packed at their bit
width, or a list of these; integers, lengths and sizes are varints. Decoding checks the frame
against its schema (the number of fields and each field's kind) and never runs code.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass

import numpy as np
import torch

VERSION = 1

DTYPES = {
    1: torch.float32,
    2: torch.float64,
    3: torch.int64,
    4: torch.int32,
    5: torch.int16,
    6: torch.uint8,
    7: torch.bool,
    8: torch.bfloat16,
}
DTYPE_CODES = {dtype: code for code, dtype in DTYPES.items()}
NUMPY_DTYPES = {
    torch.float32: "<f4",
    torch.float64: "<f8",
    torch.int64: "<i8",
    torch.int32: "<i4",
    torch.int16: "<i2",
    torch.uint8: "u1",
    torch.bool: "?",
}
NATIVE = {dtype: np.dtype(code).newbyteorder("=") for dtype, code in NUMPY_DTYPES.items()}
ITEMSIZE = {dtype: torch.empty((), dtype=dtype).element_size() for dtype in DTYPES.values()}
MAX_DIMS = 8
MAX_DEPTH = 16
"""The deepest nesting of lists a frame decodes, and of a JSON field's arrays and objects."""
TOO_DEEP = f"a frame nests lists (or a JSON field arrays and objects) more than {MAX_DEPTH} deep"

NONE, FALSE, TRUE, INT, FLOAT, STR, BYTES, TENSOR, PACKED, LIST, JSON = range(11)
KINDS = {
    "none": (NONE,),
    "bool": (FALSE, TRUE),
    "int": (INT,),
    "float": (FLOAT,),
    "str": (STR,),
    "bytes": (BYTES,),
    "tensor": (TENSOR, PACKED),
    "list": (LIST,),
    "json": (JSON,),
}
"""A schema's field kinds and the tags each accepts; ``kind?`` also takes None. A packed tensor
is a tensor: it decodes to int64."""


class FrameError(ValueError):
    """Bytes that are not a frame of the expected schema (names the field and what is wrong)."""


@dataclass(frozen=True)
class Packed:
    """``values`` (integers in [0, 2^bits)) to travel packed at ``bits`` bits each."""

    values: torch.Tensor
    bits: int


@dataclass(frozen=True)
class Json:
    """A plain JSON value (dicts, lists, strings, numbers, booleans, null) to travel as text."""

    value: object


# ----------------------------------------------------------------------------- bit packing
def pack_bits(values: np.ndarray, bits: int) -> bytes:
    """Unsigned integers below 2^``bits`` packed at ``bits`` bits each, least significant bit
    first (a whole byte width is a plain little-endian array)."""
    flat = np.ascontiguousarray(values, dtype=np.uint64).reshape(-1)
    if bits in (8, 16, 32, 64):
        return flat.astype(f"<u{bits // 8}").tobytes()
    shifts = np.arange(bits, dtype=np.uint64)
    matrix = ((flat[:, None] >> shifts) & np.uint64(1)).astype(np.uint8)
    return np.packbits(matrix.reshape(-1), bitorder="little").tobytes()


def unpack_bits(data: bytes | memoryview, bits: int, count: int) -> np.ndarray:
    """The ``count`` integers :func:`pack_bits` packed, as int64."""
    if bits in (8, 16, 32, 64):
        return np.frombuffer(data, dtype=f"<u{bits // 8}", count=count).astype(np.int64)
    flags = np.unpackbits(
        np.frombuffer(data, dtype=np.uint8), count=count * bits, bitorder="little"
    )
    matrix = flags.reshape(count, bits).astype(np.uint64)
    return (matrix << np.arange(bits, dtype=np.uint64)).sum(axis=1).astype(np.int64)


def packed_size(count: int, bits: int) -> int:
    """Bytes of ``count`` values packed at ``bits`` bits."""
    return (count * bits + 7) // 8


# ----------------------------------------------------------------------------- encoding
def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    tensor = tensor.detach().to("cpu").contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().astype("<i2").tobytes()
    return tensor.numpy().astype(NUMPY_DTYPES[tensor.dtype], copy=False).tobytes()


def varint(value: int) -> bytes:
    """``value`` >= 0 in 7-bit groups, least significant first (the high bit: more follow)."""
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def zigzag(value: int) -> int:
    """A signed 64-bit integer as an unsigned one (0, -1, 1, -2 ... -> 0, 1, 2, 3 ...)."""
    if not -(1 << 63) <= value < 1 << 63:
        raise FrameError(f"an integer travels in 64 bits, got {value}")
    return (value << 1) ^ (value >> 63)


def _shape_header(shape) -> bytes:
    if len(shape) > MAX_DIMS:
        raise FrameError(f"a tensor travels with at most {MAX_DIMS} dimensions, got {len(shape)}")
    return bytes([len(shape)]) + b"".join(varint(int(d)) for d in shape)


def _encode_value(value, out: list[bytes]) -> None:
    if value is None:
        out.append(bytes([NONE]))
    elif isinstance(value, bool):
        out.append(bytes([TRUE if value else FALSE]))
    elif isinstance(value, int):
        out.append(bytes([INT]) + varint(zigzag(value)))
    elif isinstance(value, float):
        out.append(struct.pack("<Bd", FLOAT, value))
    elif isinstance(value, str | Json | bytes | bytearray | memoryview):
        if isinstance(value, str):
            tag, data = STR, value.encode()
        elif isinstance(value, Json):
            tag, data = JSON, json.dumps(value.value, sort_keys=True, allow_nan=False).encode()
        else:
            tag, data = BYTES, bytes(value)
        out.append(bytes([tag]) + varint(len(data)))
        out.append(data)
    elif isinstance(value, torch.Tensor):
        if value.dtype not in DTYPE_CODES:
            raise FrameError(f"a tensor of dtype {value.dtype} cannot travel")
        out.append(bytes([TENSOR, DTYPE_CODES[value.dtype]]) + _shape_header(value.shape))
        out.append(_tensor_bytes(value))
    elif isinstance(value, Packed):
        values = value.values.detach().to("cpu")
        bits = int(value.bits)
        if not 1 <= bits <= 64 or values.is_floating_point():
            raise FrameError(f"packed values are integers at 1 to 64 bits, got {bits} bits")
        if values.numel() and (int(values.min()) < 0 or (bits < 64 and int(values.max()) >> bits)):
            raise FrameError(f"a packed value lies outside [0, 2^{bits})")
        out.append(bytes([PACKED, bits]) + _shape_header(values.shape))
        out.append(pack_bits(values.numpy(), bits))
    elif isinstance(value, list | tuple):
        out.append(bytes([LIST]) + varint(len(value)))
        for item in value:
            _encode_value(item, out)
    else:
        raise FrameError(f"a value of type {type(value).__name__} cannot travel in a frame")


def encode_frame(fields: dict) -> bytes:
    """The bytes of a frame holding the values of ``fields`` in the order given (its schema's
    order: names do not travel)."""
    out = [bytes([VERSION, len(fields)])]
    for value in fields.values():
        _encode_value(value, out)
    return b"".join(out)


# ----------------------------------------------------------------------------- decoding
class _Reader:
    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.at = 0

    def take(self, size: int) -> memoryview:
        if size < 0 or self.at + size > len(self.view):
            raise FrameError("the frame ends early")
        chunk = self.view[self.at : self.at + size]
        self.at += size
        return chunk

    def unpack(self, layout: str) -> tuple:
        return struct.unpack(layout, self.take(struct.calcsize(layout)))

    def byte(self) -> int:
        if self.at >= len(self.view):
            raise FrameError("the frame ends early")
        self.at += 1
        return self.view[self.at - 1]

    def varint(self) -> int:
        value = shift = 0
        while True:
            byte = self.byte()
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise FrameError("a varint longer than 64 bits")

    def shape(self) -> tuple[int, ...]:
        ndim = self.byte()
        if ndim > MAX_DIMS:
            raise FrameError(f"a tensor has at most {MAX_DIMS} dimensions, got {ndim}")
        return tuple(self.varint() for _ in range(ndim))


def nesting(value) -> int:
    """How deeply ``value`` (decoded JSON) nests lists and dicts (a scalar: 0)."""
    deepest, pending = 0, [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, list | dict):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                children = item.values() if isinstance(item, dict) else item
                pending.extend((child, depth) for child in children)
    return deepest


def _decode_value(reader: _Reader, depth: int = 0):
    tag = reader.byte()
    if tag == NONE:
        return tag, None
    if tag in (FALSE, TRUE):
        return tag, tag == TRUE
    if tag == INT:
        value = reader.varint()
        return tag, (value >> 1) ^ -(value & 1)
    if tag == FLOAT:
        return tag, reader.unpack("<d")[0]
    if tag in (STR, BYTES, JSON):
        raw = bytes(reader.take(reader.varint()))
        try:
            if tag == BYTES:
                return tag, raw
            if tag == STR:
                return tag, raw.decode()
            value = json.loads(raw.decode())
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise FrameError(f"a text field is not valid: {error}") from None
        except RecursionError:
            raise FrameError(TOO_DEEP) from None
        if nesting(value) > MAX_DEPTH:
            raise FrameError(TOO_DEEP)
        return tag, value
    if tag == TENSOR:
        code = reader.byte()
        dtype = DTYPES.get(code)
        if dtype is None:
            raise FrameError(f"unknown tensor dtype code {code}")
        shape = reader.shape()
        count = math.prod(shape)
        raw = reader.take(count * ITEMSIZE[dtype])
        if dtype == torch.bfloat16:
            array = np.frombuffer(raw, dtype="<i2").astype(np.int16)
            return tag, torch.from_numpy(array).view(torch.bfloat16).reshape(shape)
        array = np.frombuffer(raw, dtype=NUMPY_DTYPES[dtype]).astype(NATIVE[dtype])
        return tag, torch.from_numpy(array).reshape(shape)
    if tag == PACKED:
        bits = reader.byte()
        if not 1 <= bits <= 64:
            raise FrameError(f"packed values have 1 to 64 bits, got {bits}")
        shape = reader.shape()
        count = math.prod(shape)
        raw = reader.take(packed_size(count, bits))
        return tag, torch.from_numpy(unpack_bits(raw, bits, count)).reshape(shape)
    if tag == LIST:
        count = reader.varint()
        if count > len(reader.view) - reader.at:
            raise FrameError("a list is longer than the frame")
        if depth >= MAX_DEPTH:
            raise FrameError(TOO_DEEP)
        return tag, [_decode_value(reader, depth + 1)[1] for _ in range(count)]
    raise FrameError(f"unknown value tag {tag}")


def decode_frame(data: bytes, schema: dict[str, str], what: str = "message") -> dict:
    """The fields of the frame ``data``, which must hold exactly the fields of ``schema``
    (name -> kind, one of :data:`KINDS`, ``?`` appended where None is allowed), in its order."""
    reader = _Reader(data)
    version, count = reader.unpack("<BB")
    if version != VERSION:
        raise FrameError(f"{what}: frame version {version}, this reader reads {VERSION}")
    if count != len(schema):
        raise FrameError(f"{what}: {count} fields, expected {len(schema)} ({list(schema)})")
    fields = {}
    for name, kind in schema.items():
        tag, value = _decode_value(reader)
        optional = kind.endswith("?")
        allowed = KINDS[kind.rstrip("?")] + ((NONE,) if optional else ())
        if tag not in allowed:
            raise FrameError(f"{what}: field {name!r} must be a {kind}, got tag {tag}")
        fields[name] = value
    if reader.at != len(reader.view):
        raise FrameError(f"{what}: {len(reader.view) - reader.at} bytes after the last field")
    return fields
