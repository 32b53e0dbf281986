"""The simulated clock: seconds on one timeline per run, moved by every protocol's rounds through
its :class:`Network` (message sizes, latency, stragglers)."""

from __future__ import annotations

from vfl_lightning.seeding import derive_seed
from vfl_lightning.wire.network import Network


class SimulatedClock:
    """Simulated wall time of a run with ``num_parties`` parties on ``network``.

    A plain round (:meth:`sync_round`) lasts as long as its slowest participating party: the
    parties that sent anything upload (straggler delay + transfer), then the server's replies
    come down (transfer); compute is not charged there. Protocols with their own timeline (FedVS)
    compute a round's length from the same network and :meth:`advance` by it. The straggler draws
    come from a generator seeded by ``seed`` and are checkpointed with the time.
    """

    def __init__(self, network: Network | None = None, num_parties: int = 1, seed: int = 0) -> None:
        self.network = network or Network()
        self.delays = self.network.stragglers(
            num_parties, derive_seed(seed, "simulation", "stragglers")
        )
        self.now = 0.0

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot move the clock back by {seconds} s")
        self.now += float(seconds)
        return self.now

    def sync_round(self, uplink_bits: list[int], downlink_bits: list[int]) -> float:
        """Advance by the slowest participating upload plus the slowest download; return now."""
        taking_part = [
            m for m, (up, down) in enumerate(zip(uplink_bits, downlink_bits)) if up or down
        ]
        if not taking_part:
            return self.now
        delays = self.delays.draw() if self.network.has_stragglers else None
        transfer = self.network.link_seconds
        upload = max(
            transfer(uplink_bits[m]) + (0.0 if delays is None else float(delays[m]))
            for m in taking_part
        )
        download = max(transfer(downlink_bits[m]) for m in taking_part)
        return self.advance(upload + download)

    def state_dict(self) -> dict:
        return {"now": self.now, "delays": self.delays.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.now = float(state["now"])
        self.delays.load_state_dict(state["delays"])
