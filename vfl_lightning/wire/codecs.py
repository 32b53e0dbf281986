"""How a message crosses between processes, in the protocol's encoded form: a codec turns a tensor
into frame values (:mod:`~vfl_lightning.wire.frames`) and back, and says how many bits its form
takes (what the ledger counts). The uplink codec follows the mechanism (ring elements packed at
their bit width), the downlink codec what the server sends (float32 gradients, or the top-k
entries of a sparsified gradient as packed indices and values): the server encodes, the party
decodes in its own process, and the other way round."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vfl_lightning.wire.frames import FrameError, Packed


def index_bits(count: int) -> int:
    """Bits of one index into ``count`` elements."""
    return max(1, math.ceil(math.log2(max(count, 2))))


class Codec:
    """Dense: the tensor's own bytes (float32 gradients and embeddings, any dtype)."""

    name = "dense"

    def encode(self, tensor: torch.Tensor) -> list:
        return [self.name, tensor.detach().to("cpu")]

    def decode(self, form) -> torch.Tensor:
        """The tensor of ``form`` (what :meth:`encode` made); a form of another codec, or one whose
        parts do not fit together, raises :class:`FrameError`."""
        return decode_form(form, (self.name,))

    def bits(self, tensor: torch.Tensor) -> int:
        """Bits of ``tensor``'s form on the wire, from its shape and dtype alone."""
        return tensor.numel() * tensor.element_size() * 8


@dataclass(frozen=True)
class RingCodec(Codec):
    """Integers in [0, 2^``width``) (secure-aggregation ring elements) packed at ``width`` bits."""

    width: int
    name = "ring"

    def encode(self, tensor: torch.Tensor) -> list:
        return [self.name, Packed(tensor.detach().to("cpu"), self.width)]

    def bits(self, tensor: torch.Tensor) -> int:
        return tensor.numel() * self.width


@dataclass(frozen=True)
class TopKCodec(Codec):
    """A gradient of which only the ceil(``keep_fraction`` · n) largest-magnitude entries are sent
    (the rest are zero): their flat indices packed at ⌈log2 n⌉ bits, and their float32 values.
    Decoding scatters them into zeros, so the party gets exactly the sparsified gradient."""

    keep_fraction: float
    name = "topk"

    def kept(self, count: int) -> int:
        return min(count, max(1, math.ceil(self.keep_fraction * count)))

    def encode(self, tensor: torch.Tensor) -> list:
        flat = tensor.detach().to("cpu").reshape(-1)
        indices = flat.abs().topk(self.kept(flat.numel())).indices.sort().values
        packed = Packed(indices, index_bits(flat.numel()))
        return [self.name, list(tensor.shape), packed, flat[indices].float()]

    def bits(self, tensor: torch.Tensor) -> int:
        count = tensor.numel()
        return self.kept(count) * (32 + index_bits(count))


def describe(form) -> str:
    if isinstance(form, list) and form and isinstance(form[0], str):
        return f"a {form[0]} message"
    return f"a {type(form).__name__}"


def _topk_tensor(form: list) -> torch.Tensor:
    shape, indices, values = form[1:]
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise FrameError("a topk message's shape is a list of sizes")
    count = math.prod(shape)
    valid = (
        isinstance(indices, torch.Tensor)
        and isinstance(values, torch.Tensor)
        and indices.dim() == values.dim() == 1
        and len(indices) == len(values) <= count
        and indices.dtype == torch.int64
        and values.dtype == torch.float32
        and (not len(indices) or (int(indices.min()) >= 0 and int(indices.max()) < count))
    )
    if not valid:
        raise FrameError(
            f"a topk message of shape {shape} carries in-range int64 indices and as many float32 "
            "values"
        )
    flat = torch.zeros(count, dtype=torch.float32)
    flat[indices] = values
    return flat.reshape(shape)


FORMS = {"dense": 2, "ring": 2, "topk": 4}
"""The forms a message may take on the wire, with their number of parts."""


def decode_form(form, accepted: tuple[str, ...] = tuple(FORMS)) -> torch.Tensor:
    """The tensor a codec's ``form`` carries (any of the ``accepted`` forms); anything else, or
    parts that do not fit together, raises :class:`FrameError`."""
    name = form[0] if isinstance(form, list) and form and isinstance(form[0], str) else None
    if name not in accepted or len(form) != FORMS[name]:
        raise FrameError(f"expected a {' or '.join(accepted)} message, got {describe(form)}")
    if name == "topk":
        return _topk_tensor(form)
    if not isinstance(form[1], torch.Tensor):
        raise FrameError(f"a {name} message carries a tensor")
    return form[1]
