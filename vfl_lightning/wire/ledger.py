"""Communication ledger: bits per party and direction, rounds, and an optional transcript."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

UPLINK = "up"
DOWNLINK = "down"
PEER = "peer"


@dataclass(frozen=True)
class Entry:
    """One message as the transcript records it."""

    round: int
    direction: str
    party: int
    kind: str
    shape: tuple[int, ...]
    bits: int


class Ledger:
    """Counts bits per party per direction and communication rounds.

    ``uplink`` is party -> server, ``downlink`` server -> party, ``peer`` party -> party (FedVS
    shares; charged to the sender). Bits are Python ints computed from shapes, so counting never
    synchronizes with an accelerator. ``transcript_size`` > 0 keeps the last that many messages.
    ``serialized_bytes`` counts what a multi-process runtime actually serialized for training
    messages (both directions; 0 in the local runtime, where nothing is serialized);
    ``socket_bytes`` what the kernel counted on the sockets to the parties during training calls
    (``runtime=grpc``; None where no runtime counts it).
    ``psi_bytes`` counts the sample alignment's messages (both directions, every party), apart
    from the training traffic.
    """

    def __init__(self, num_parties: int, transcript_size: int = 0) -> None:
        self.num_parties = num_parties
        self.transcript_size = transcript_size
        self.reset()

    def reset(self) -> None:
        self.bits = {d: [0] * self.num_parties for d in (UPLINK, DOWNLINK, PEER)}
        self.rounds = 0
        self.serialized_bytes = 0
        self.socket_bytes: int | None = None
        self.psi_bytes = 0
        self.transcript: deque[Entry] = deque(maxlen=self.transcript_size or None)

    def record(self, direction: str, party: int, bits: int, kind: str = "", shape=()) -> None:
        self.bits[direction][party] += bits
        if self.transcript_size:
            self.transcript.append(Entry(self.rounds, direction, party, kind, tuple(shape), bits))

    def record_serialized(self, nbytes: int) -> None:
        self.serialized_bytes += int(nbytes)

    def record_socket(self, nbytes: int) -> None:
        self.socket_bytes = (self.socket_bytes or 0) + int(nbytes)

    def record_psi(self, nbytes: int) -> None:
        self.psi_bytes += int(nbytes)

    def end_round(self) -> None:
        self.rounds += 1

    def total_bits(self, direction: str) -> int:
        return sum(self.bits[direction])

    def megabytes(self, direction: str) -> float:
        """Total of ``direction`` in MB (10^6 bytes)."""
        return self.total_bits(direction) / 8e6

    def state_dict(self) -> dict:
        return {
            "bits": {d: list(v) for d, v in self.bits.items()},
            "rounds": self.rounds,
            "serialized_bytes": self.serialized_bytes,
            "socket_bytes": self.socket_bytes,
            "psi_bytes": self.psi_bytes,
        }

    def load_state_dict(self, state: dict) -> None:
        if len(state["bits"][UPLINK]) != self.num_parties:
            raise ValueError(
                f"ledger state is for {len(state['bits'][UPLINK])} parties, this run has {self.num_parties}"
            )
        self.bits = {d: list(v) for d, v in state["bits"].items()}
        self.rounds = int(state["rounds"])
        self.serialized_bytes = int(state.get("serialized_bytes", 0))
        socket_bytes = state.get("socket_bytes")
        self.socket_bytes = None if socket_bytes is None else int(socket_bytes)
        self.psi_bytes = int(state.get("psi_bytes", 0))
