"""The wire: every value that crosses between parties and the server goes through it.

It counts bits in the :class:`Ledger`, moves the :class:`SimulatedClock`, and keeps what each
party exchanged (``observed``, ``exchanged``), so attacks and tests can look at exactly that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from vfl_lightning.wire.clock import SimulatedClock
from vfl_lightning.wire.codecs import Codec
from vfl_lightning.wire.ledger import DOWNLINK, PEER, UPLINK, Ledger


def tensor_bits(tensor: torch.Tensor, bits_per_element: int | None = None) -> int:
    """Bits of ``tensor`` on the wire: its element count times ``bits_per_element``
    (default: the dtype's own width, e.g. 32 for float32)."""
    width = bits_per_element if bits_per_element is not None else tensor.element_size() * 8
    return tensor.numel() * width


class Message(NamedTuple):
    """One message as a party saw it: sent (``up``) or received (``down``), its kind, its value."""

    direction: str
    kind: str
    payload: torch.Tensor


Listener = Callable[[int, Message], None]
"""Called with (party, message) for every message the wire carries (after any gradient filter)."""
GradientFilter = Callable[[int, torch.Tensor], torch.Tensor]
"""Maps (party, gradient) to the gradient the server actually sends (a server-side defense)."""


class Wire:
    """Sends messages between M parties and the server, counting and timing them.

    What a party saw: ``observed[direction][m]`` is the last payload in each direction, and
    ``exchanged[m]`` every message of the last round in which party m took part, with
    ``exchanged_round[m]`` that round's number (attacks read a party's view from here).
    ``listeners`` (attack recorders) see every message as it arrives; ``gradient_filters``
    (defenses the server deploys) transform each downlink ``gradient`` before it is sent. Both are
    empty unless an attack or defense is configured, and then change nothing else.
    ``downlink_codec`` is the form a ``gradient`` crosses in (:mod:`~vfl_lightning.wire.codecs`:
    float32 by default, the top-k entries under gradient sparsification), and its bits are what
    the ledger counts for it.
    """

    def __init__(
        self, num_parties: int, clock: SimulatedClock | None = None, transcript_size: int = 0
    ) -> None:
        self.num_parties = num_parties
        self.ledger = Ledger(num_parties, transcript_size)
        self.clock = clock or SimulatedClock()
        self.observed: dict[str, dict[int, torch.Tensor]] = {UPLINK: {}, DOWNLINK: {}, PEER: {}}
        self.exchanged: list[list[Message]] = [[] for _ in range(num_parties)]
        self.exchanged_round = [-1] * num_parties
        self._round_bits = {UPLINK: [0] * num_parties, DOWNLINK: [0] * num_parties}
        self.listeners: list[Listener] = []
        self.gradient_filters: list[GradientFilter] = []
        self.downlink_codec: Codec = Codec()

    def send(
        self,
        direction: str,
        party: int,
        payload: torch.Tensor,
        *,
        bits_per_element: int | None = None,
        kind: str = "",
    ) -> torch.Tensor:
        """Carry ``payload`` (detached) between party ``party`` and the server; return what arrives."""
        payload = payload.detach()
        if self.gradient_filters and direction == DOWNLINK and kind == "gradient":
            for gradient_filter in self.gradient_filters:
                payload = gradient_filter(party, payload).detach()
        if bits_per_element is None and direction == DOWNLINK and kind == "gradient":
            bits = self.downlink_codec.bits(payload)
        else:
            bits = tensor_bits(payload, bits_per_element)
        self.ledger.record(direction, party, bits, kind, payload.shape)
        round_bits = self._round_bits.get(direction)
        if round_bits is not None:
            round_bits[party] += bits
        self.observed[direction][party] = payload
        rounds = self.ledger.rounds
        if self.exchanged_round[party] != rounds:
            self.exchanged[party] = []
            self.exchanged_round[party] = rounds
        message = Message(direction, kind, payload)
        self.exchanged[party].append(message)
        for listener in self.listeners:
            listener(party, message)
        return payload

    def uplink(
        self,
        payloads: Sequence[torch.Tensor],
        *,
        bits_per_element: int | None = None,
        kind: str = "embedding",
    ) -> list[torch.Tensor]:
        """Each party m sends ``payloads[m]`` to the server."""
        send = self.send
        return [
            send(UPLINK, m, p, bits_per_element=bits_per_element, kind=kind)
            for m, p in enumerate(payloads)
        ]

    def downlink(
        self,
        payloads: Sequence[torch.Tensor],
        *,
        bits_per_element: int | None = None,
        kind: str = "gradient",
    ) -> list[torch.Tensor]:
        """The server sends ``payloads[m]`` to party m."""
        send = self.send
        return [
            send(DOWNLINK, m, p, bits_per_element=bits_per_element, kind=kind)
            for m, p in enumerate(payloads)
        ]

    def end_round(self, duration_s: float | None = None) -> None:
        """Close a communication round: count it and advance the clock, by ``duration_s`` when
        the protocol timed the round itself, else by the network's time for the round's bits."""
        if duration_s is None:
            self.clock.sync_round(self._round_bits[UPLINK], self._round_bits[DOWNLINK])
        else:
            self.clock.advance(duration_s)
        self.ledger.end_round()
        self._round_bits = {UPLINK: [0] * self.num_parties, DOWNLINK: [0] * self.num_parties}

    def state_dict(self) -> dict:
        return {"ledger": self.ledger.state_dict(), "clock": self.clock.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.ledger.load_state_dict(state["ledger"])
        self.clock.load_state_dict(state["clock"])
