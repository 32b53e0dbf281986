"""Messages without pickle: frames of a fixed schema (bytes with dtype and shape, ring elements
packed at their width, varints) and the codecs of the uplink and the downlink."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from vfl_lightning.privacy.defenses.gradient import sparsify
from vfl_lightning.wire.codecs import Codec, RingCodec, TopKCodec, decode_form
from vfl_lightning.wire.frames import (
    FrameError,
    Json,
    Packed,
    decode_frame,
    encode_frame,
    pack_bits,
    packed_size,
    unpack_bits,
)

SCHEMA = {"x": "tensor", "n": "int", "name": "str", "round": "int?", "form": "list", "j": "json"}


def sample() -> dict:
    return {
        "x": torch.arange(12.0).reshape(3, 4) / 7,
        "n": -7,
        "name": "train",
        "round": None,
        "form": ["ring", Packed(torch.tensor([[0, 127], [5, 64]]), 7)],
        "j": Json({"b": [1, 2.5, None], "a": "x"}),
    }


def test_a_frame_round_trips_every_kind_exactly():
    data = encode_frame(sample())
    back = decode_frame(data, SCHEMA)
    assert torch.equal(back["x"], sample()["x"]) and back["x"].dtype == torch.float32
    assert back["n"] == -7 and back["name"] == "train" and back["round"] is None
    assert back["form"][0] == "ring" and back["form"][1].dtype == torch.int64
    assert torch.equal(back["form"][1], torch.tensor([[0, 127], [5, 64]]))
    assert back["j"] == {"b": [1, 2.5, None], "a": "x"}
    for dtype in (torch.float64, torch.int32, torch.int16, torch.uint8, torch.bool, torch.bfloat16):
        tensor = torch.arange(6).reshape(2, 3).to(dtype)
        assert torch.equal(decode_frame(encode_frame({"t": tensor}), {"t": "tensor"})["t"], tensor)
    for value in (0, 1, -1, 2**63 - 1, -(2**63), 300):
        assert decode_frame(encode_frame({"i": value}), {"i": "int"})["i"] == value


@pytest.mark.parametrize("bits", [1, 3, 7, 8, 11, 16, 31, 33, 63, 64])
def test_ring_elements_are_packed_at_their_bit_width(bits):
    rng = np.random.default_rng(bits)
    values = rng.integers(0, 2 ** min(bits, 62), size=101, dtype=np.int64)
    data = pack_bits(values, bits)
    assert len(data) == packed_size(101, bits) == (101 * bits + 7) // 8
    assert np.array_equal(unpack_bits(data, bits, 101), values)


def test_a_ring_message_costs_its_bits_and_a_few_header_bytes():
    counts = torch.randint(0, 128, (32, 16))
    codec = RingCodec(7)
    data = encode_frame({"m": codec.encode(counts)})
    assert codec.bits(counts) == 32 * 16 * 7
    assert len(data) - codec.bits(counts) // 8 < 16
    assert torch.equal(codec.decode(decode_frame(data, {"m": "list"})["m"]), counts)
    with pytest.raises(FrameError, match="outside"):
        encode_frame({"m": codec.encode(torch.tensor([128]))})


def test_a_sparsified_gradient_crosses_as_its_top_k_entries_and_decodes_exactly():
    gradient = sparsify(torch.randn(32, 16), keep_fraction=0.1)
    codec = TopKCodec(0.1)
    data = encode_frame({"g": codec.encode(gradient)})
    assert codec.bits(gradient) == 52 * (32 + 9)  # ceil(0.1 * 512) entries, 9-bit indices
    assert len(data) < 0.15 * gradient.numel() * 4
    assert torch.equal(decode_form(decode_frame(data, {"g": "list"})["g"]), gradient)
    assert Codec().bits(gradient) == 512 * 32


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d[:-1], "ends early"),
        (lambda d: d + b"\x00", "bytes after the last field"),
        (lambda d: b"\x02" + d[1:], "frame version 2"),
        (lambda d: d[:1] + b"\x05" + d[2:], "5 fields, expected 6"),
        (lambda d: d[:2] + b"\x03" + d[3:], "field 'x' must be a tensor"),
    ],
)
def test_a_frame_that_does_not_match_its_schema_is_refused(mutate, message):
    with pytest.raises(FrameError, match=message):
        decode_frame(mutate(encode_frame(sample())), SCHEMA)


def test_a_pickle_is_not_a_frame():
    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    with pytest.raises(FrameError):
        decode_frame(pickle.dumps(Payload()), SCHEMA)
    with pytest.raises(FrameError, match="cannot travel"):
        encode_frame({"x": Payload()})


@pytest.mark.parametrize(
    "form",
    [
        ["dense"],
        ["sparse", torch.zeros(2)],
        ["topk", [4], torch.tensor([7]), torch.tensor([1.0])],
        ["topk", [4], torch.tensor([0, 1]), torch.tensor([1.0])],
        ["topk", [4], torch.tensor([0]), torch.tensor([1.0], dtype=torch.float64)],
        "dense",
    ],
)
def test_a_malformed_gradient_form_is_refused(form):
    with pytest.raises(FrameError):
        decode_form(form, ("dense", "topk"))
