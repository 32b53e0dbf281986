"""Simulated clock and message delay models (seconds on a simulated timeline)."""

from __future__ import annotations

import numpy as np


class DelayModel:
    """Zero latency: every message arrives at once. Subclasses draw per-party delays."""

    def delays(self, num_parties: int, bits: list[int] | None = None) -> np.ndarray:
        return np.zeros(num_parties)


class Bandwidth(DelayModel):
    """Transfer time of ``bits`` at ``mbps`` megabits per second, plus a fixed ``latency_s``."""

    def __init__(self, mbps: float = 300.0, latency_s: float = 0.0) -> None:
        if mbps <= 0:
            raise ValueError(f"mbps must be > 0, got {mbps}")
        if latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {latency_s}")
        self.mbps = mbps
        self.latency_s = latency_s

    def delays(self, num_parties: int, bits: list[int] | None = None) -> np.ndarray:
        sizes = np.zeros(num_parties) if bits is None else np.asarray(bits, dtype=np.float64)
        return self.latency_s + sizes / (self.mbps * 1e6)


class SimulatedClock:
    """Simulated wall time. A synchronous round lasts as long as its slowest party's messages."""

    def __init__(self, delay_model: DelayModel | None = None) -> None:
        self.delay_model = delay_model or DelayModel()
        self.now = 0.0

    def advance(self, seconds: float) -> float:
        if seconds < 0:
            raise ValueError(f"cannot move the clock back by {seconds} s")
        self.now += float(seconds)
        return self.now

    def sync_round(self, uplink_bits: list[int], downlink_bits: list[int]) -> float:
        """Advance by the slowest party's uplink plus the slowest downlink; return the new time."""
        up = self.delay_model.delays(len(uplink_bits), uplink_bits)
        down = self.delay_model.delays(len(downlink_bits), downlink_bits)
        return self.advance(float(up.max(initial=0.0)) + float(down.max(initial=0.0)))

    def state_dict(self) -> dict:
        return {"now": self.now}

    def load_state_dict(self, state: dict) -> None:
        self.now = float(state["now"])
