"""What one role observed: the messages a wire listener recorded in a training batch, reduced to
the view of the server or of one passive party (plain tensors, no module of another role)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from vfl_lightning.wire import DOWNLINK, UPLINK, Message

ROLES = ("server", "party", "eavesdropper")


class BatchRecorder:
    """A :class:`~vfl_lightning.wire.Wire` listener: every message of the current training batch,
    by party, in the order the wire carried them (:meth:`clear` at each batch start)."""

    def __init__(self) -> None:
        self.messages: dict[int, list[Message]] = defaultdict(list)

    def __call__(self, party: int, message: Message) -> None:
        self.messages[party].append(message)

    def clear(self) -> None:
        self.messages = defaultdict(list)

    def last(self, party: int, direction: str, kinds: Sequence[str]) -> torch.Tensor | None:
        """The last payload party ``party`` exchanged in ``direction`` with a kind in ``kinds``."""
        for message in reversed(self.messages.get(party, [])):
            if message.direction == direction and message.kind in kinds:
                return message.payload
        return None


@dataclass(frozen=True)
class ServerView:
    """What the server received in one training batch: ``idx`` (the sample ids it schedules),
    ``labels`` (it holds them), and ``received``: one row per sample, either the target party's
    own message (``separate=True``, a wire that carries each party's message apart) or the fused
    value the server computed from every party's message (secure aggregation: only the sum)."""

    idx: torch.Tensor
    labels: torch.Tensor
    received: torch.Tensor
    separate: bool


@dataclass(frozen=True)
class PartyView:
    """What passive party ``party`` received in one training batch: the ``gradient`` rows of its
    own samples ``idx`` (first-order protocols; the server never sends it labels)."""

    party: int
    idx: torch.Tensor
    gradient: torch.Tensor


EMBEDDING_KINDS = ("embedding",)
CODED_KINDS = ("coded_embedding",)


def server_view(
    recorder: BatchRecorder,
    idx: torch.Tensor,
    labels: torch.Tensor,
    *,
    target_party: int,
    num_parties: int,
    secure_sum: Callable[[list[torch.Tensor]], torch.Tensor] | None,
    decode: Callable[[list[int], list[torch.Tensor]], torch.Tensor] | None = None,
) -> ServerView | None:
    """The server's view of the batch for an attack on ``target_party``; ``secure_sum`` (the
    server's own fusion of masked messages) when individual messages are masked; ``decode`` (the
    server's own decoding of the responders' coded embeddings, FedVS) when messages are coded.
    None when the target party sent no per-sample embedding of this batch (e.g. another client's
    turn, or a FedVS round it did not take part in)."""
    if decode is not None:
        responders = [
            m for m in range(num_parties) if recorder.last(m, UPLINK, CODED_KINDS) is not None
        ]
        if not responders:
            return None
        fused = decode(responders, [recorder.last(m, UPLINK, CODED_KINDS) for m in responders])
        if fused.shape[0] != idx.shape[0]:
            return None
        return ServerView(idx, labels, fused.reshape(fused.shape[0], -1).float(), separate=False)
    if secure_sum is None:
        own = recorder.last(target_party, UPLINK, EMBEDDING_KINDS)
        if own is None or own.shape[0] != idx.shape[0]:
            return None
        return ServerView(idx, labels, own.reshape(own.shape[0], -1).float(), separate=True)
    messages = [recorder.last(m, UPLINK, EMBEDDING_KINDS) for m in range(num_parties)]
    if any(msg is None or msg.shape[0] != idx.shape[0] for msg in messages):
        return None
    fused = secure_sum(messages)
    return ServerView(idx, labels, fused.reshape(fused.shape[0], -1).float(), separate=False)


def party_view(recorder: BatchRecorder, idx: torch.Tensor, party: int) -> PartyView | None:
    """Party ``party``'s received gradient for the batch, or None (no gradient of this batch)."""
    gradient = recorder.last(party, DOWNLINK, ("gradient",))
    if gradient is None or gradient.shape[0] != idx.shape[0]:
        return None
    return PartyView(party, idx, gradient.reshape(gradient.shape[0], -1).float())
