"""The wire: messages between parties and the server, the ledger that counts them, the clock and
the network model it runs on."""

from vfl_lightning.wire.clock import SimulatedClock
from vfl_lightning.wire.ledger import DOWNLINK, PEER, UPLINK, Entry, Ledger
from vfl_lightning.wire.network import Network
from vfl_lightning.wire.wire import Message, Wire, tensor_bits

__all__ = [
    "DOWNLINK",
    "PEER",
    "UPLINK",
    "Entry",
    "Ledger",
    "Message",
    "Network",
    "SimulatedClock",
    "Wire",
    "tensor_bits",
]
