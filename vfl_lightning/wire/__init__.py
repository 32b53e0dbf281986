"""The wire: messages between parties and the server, the ledger that counts them, the clock."""

from vfl_lightning.wire.clock import Bandwidth, DelayModel, SimulatedClock
from vfl_lightning.wire.ledger import DOWNLINK, PEER, UPLINK, Entry, Ledger
from vfl_lightning.wire.wire import Wire, tensor_bits

__all__ = [
    "DOWNLINK",
    "PEER",
    "UPLINK",
    "Bandwidth",
    "DelayModel",
    "Entry",
    "Ledger",
    "SimulatedClock",
    "Wire",
    "tensor_bits",
]
