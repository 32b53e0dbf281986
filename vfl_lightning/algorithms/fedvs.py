"""FedVS (Algorithm 1, lines 11-36) and its Wait / Ignore / Wait-DP baselines on one simulated clock.

All four use polynomial-network parties, segment batches (|B| positions from each of K segments),
the §6.2 straggler delays and message times from real sizes; only the aggregation differs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.data.segments import SegmentedDataModule
from vfl_lightning.mechanisms.analytic_gaussian import analytic_gaussian_sigma, privatize_embedding
from vfl_lightning.mechanisms.fedvs import FedVSCodec
from vfl_lightning.mechanisms.field import DEFAULT_PRIME
from vfl_lightning.models.pn import PolynomialNetwork
from vfl_lightning.wire import DOWNLINK, PEER, UPLINK
from vfl_lightning.wire.stragglers import (
    RoundTiming,
    StragglerDelays,
    fedvs_timing,
    model_sharing_scale,
    transfer_seconds,
    wait_timing,
)

STRATEGIES = ("fedvs", "wait", "ignore", "wait_dp")
SHORTFALL_POLICIES = ("raise", "wait")
FLOAT_BITS = 32


class StragglerShortfall(RuntimeError):
    """Fewer than R coded embeddings arrived by the configured deadline (algo.on_shortfall=raise)."""


class FedVSFamily(VFLModule):
    """One synchronous round per batch on the simulated clock, with ``strategy``:

    - ``fedvs``: clients share their quantized models (T masks) every round, every client uploads a
      coded embedding (eq. 5), the server decodes the exact quantized sum from the first
      R = 2(K+T-1)+1 arrivals (eqs. 6-7), and broadcasts dL/dH; each client updates its real model
      with (1/N) dL/dH through its own plaintext embedding (line 34).
    - ``wait``: plain average of all N embeddings (waits for the slowest client).
    - ``ignore``: average of the embeddings that arrived within the time FedVS would have waited in
      the same round (same delay draws); only those clients get a gradient.
    - ``wait_dp``: ``wait`` on embeddings clipped to L2 norm ``dp_clip`` per sample plus Gaussian
      noise calibrated by the analytic Gaussian mechanism to (``dp_epsilon``, ``dp_delta``) per
      release, sensitivity 2 * dp_clip.

    Every party model is projected to |w| <= ``weight_bound`` after each step (the paper's bounded
    parameters, Assumption 4), which with the data range makes the overflow pre-check a guarantee.
    Local compute times are modelled as multiply-adds / ``macs_per_second`` (field MACs cost
    ``field_op_cost`` float MACs: three float64 products per limb-split field product).
    """

    def __init__(
        self,
        parties,
        head,
        mechanism,
        optimizer,
        num_classes: int,
        *,
        name: str = "fedvs",
        strategy: str = "fedvs",
        K: int = 1,
        T: int = 1,
        l_x: int = 8,
        l_w: int = 8,
        prime: int = DEFAULT_PRIME,
        weight_bound: float = 4.0,
        fast_mean: float = 0.1,
        straggler_base: float = 2.0,
        straggler_slope: float = 4.0,
        straggler_fraction: float = 0.5,
        mbps: float = 300.0,
        macs_per_second: float = 1e9,
        field_op_cost: float = 3.0,
        deadline_s: float | None = None,
        on_shortfall: str = "raise",
        max_simulated_s: float | None = None,
        dp_epsilon: float = 5.0,
        dp_delta: float = 1e-5,
        dp_clip: float = 1.0,
        dp_at_eval: bool = True,
        **kwargs,
    ) -> None:
        super().__init__(parties, head, mechanism, optimizer, num_classes, name=name, **kwargs)
        if strategy not in STRATEGIES:
            raise ValueError(f"algo.strategy must be one of {STRATEGIES}, got {strategy!r}")
        if on_shortfall not in SHORTFALL_POLICIES:
            raise ValueError(
                f"algo.on_shortfall must be one of {SHORTFALL_POLICIES}, got {on_shortfall!r}"
            )
        for label, value in (("deadline_s", deadline_s), ("max_simulated_s", max_simulated_s)):
            if value is not None and not value > 0:
                raise ValueError(f"algo.{label} must be > 0 or null, got {value}")
        for label, value in (
            ("mbps", mbps),
            ("macs_per_second", macs_per_second),
            ("dp_clip", dp_clip),
        ):
            if not value > 0:
                raise ValueError(f"algo.{label} must be > 0, got {value}")
        bad = [type(p).__name__ for p in self.parties if not isinstance(p, PolynomialNetwork)]
        if bad:
            raise ValueError(
                f"algo={name} needs polynomial-network parties (party=pn), got {bad[0]}"
            )
        if getattr(mechanism, "fusion", None) != "mean":
            raise ValueError(
                f"algo={name} averages the embeddings: mechanism.fusion must be 'mean', "
                f"got {getattr(mechanism, 'fusion', None)!r}"
            )
        self.strategy = strategy
        self.codec = FedVSCodec(
            self.num_parties, K, T, l_x=l_x, l_w=l_w, prime=prime, weight_bound=weight_bound
        )
        self.K, self.T = K, T
        self.weight_bound = float(weight_bound)
        self.delays = StragglerDelays(
            self.num_parties,
            fast_mean=fast_mean,
            straggler_base=straggler_base,
            straggler_slope=straggler_slope,
            straggler_fraction=straggler_fraction,
            seed=self.seed + 7177,
        )
        self.mbps = float(mbps)
        self.macs_per_second = float(macs_per_second)
        self.field_op_cost = float(field_op_cost)
        self.deadline_s = deadline_s
        self.on_shortfall = on_shortfall
        self.max_simulated_s = max_simulated_s
        self.dp_clip = float(dp_clip)
        self.dp_at_eval = bool(dp_at_eval)
        self.dp_sigma = (
            analytic_gaussian_sigma(epsilon=dp_epsilon, delta=dp_delta, sensitivity=2 * dp_clip)
            if strategy == "wait_dp"
            else 0.0
        )
        self.val_curve: list[tuple[int, float, float]] = []
        self.shortfall_rounds = 0
        self.data_shared = False
        self.data_sharing_s = 0.0
        self.per_segment_batch = 0
        self._project_weights()

    @classmethod
    def check_party_class(cls, party_class: type, name: str) -> None:
        if not issubclass(party_class, PolynomialNetwork):
            raise ValueError(
                f"algo={name} needs polynomial-network parties (party=pn), got {party_class.__name__}"
            )

    # ----------------------------------------------------------------- setup
    def on_train_start(self) -> None:
        datamodule = self.trainer.datamodule
        if not isinstance(datamodule, SegmentedDataModule) or datamodule.segments != self.K:
            raise ValueError(
                f"algo={self.name} needs data._target_=vfl_lightning.data.segments."
                f"SegmentedDataModule with segments=algo.K={self.K} (the algo configs set it), "
                f"got {type(datamodule).__name__}"
            )
        self.per_segment_batch = datamodule.per_segment_batch
        self._cost_model()
        if self.strategy == "fedvs":
            self._share_data([x.to(self.device) for x in datamodule.splits["train"].xs])

    def _cost_model(self) -> None:
        """Message sizes and modelled compute times of one round (host floats, from shapes)."""
        N, B, h = self.num_parties, self.per_segment_batch, self.widths[0]
        features = [p.num_power_features for p in self.parties]
        bits, field, rate = self.codec.element_bits, self.field_op_cost, self.macs_per_second
        self.model_share_bits = [f * h * bits for f in features]
        self.share_seconds = np.asarray(
            [
                transfer_seconds((N - 1) * s, self.mbps) + N * (self.T + 1) * f * h * field / rate
                for s, f in zip(self.model_share_bits, features, strict=True)
            ]
        )
        self.coded_compute_s = B * sum(features) * h * field / rate
        self.coded_upload_s = float(transfer_seconds(B * h * bits, self.mbps))
        self.decode_s = self.K * self.codec.threshold * B * h * field / rate
        self.plain_compute_s = np.array([self.K * B * f * h / rate for f in features])
        self.plain_upload_s = np.full(N, transfer_seconds(self.K * B * h * FLOAT_BITS, self.mbps))
        self.download_s = float(transfer_seconds(self.K * B * h * FLOAT_BITS, self.mbps))
        self.update_s = max(2 * self.K * B * f * h / rate for f in features)

    def _share_data(self, train_xs: Sequence[torch.Tensor]) -> None:
        """Algorithm 1 lines 1-10, once; charged to the ledger and the clock on a fresh run only."""
        self.codec.check(train_xs, [p.degree for p in self.parties])
        generator = torch.Generator(device=self.device).manual_seed(self.seed * 7919 + 1)
        with torch.no_grad():
            features = [p.power_features(x) for p, x in zip(self.parties, train_xs, strict=True)]
        bits = self.codec.share_data(features, generator=generator)
        if self.data_shared:
            return
        N = self.num_parties
        seconds = []
        for n, share_bits in enumerate(bits):
            self.wire.ledger.record(PEER, n, (N - 1) * share_bits, kind="data_share")
            encode = N * (self.K + self.T) * share_bits / self.codec.element_bits
            seconds.append(
                transfer_seconds((N - 1) * share_bits, self.mbps)
                + encode * self.field_op_cost / self.macs_per_second
            )
        self.data_sharing_s = float(max(seconds))
        self.wire.clock.advance(self.data_sharing_s)
        self.data_shared = True

    # ----------------------------------------------------------------- one round
    def training_step(self, batch, batch_idx):
        xs, y, idx = batch
        if self.strategy == "fedvs":
            loss, logits = self.fedvs_round(xs, y, idx[: self.per_segment_batch])
        else:
            loss, logits = self.baseline_round(xs, y)
        self.log_train_step(loss, logits, y)
        self.log("time/simulated_s", self.wire.clock.now, on_step=True, on_epoch=False)
        if self.max_simulated_s is not None and self.wire.clock.now >= self.max_simulated_s:
            self.trainer.should_stop = True
        return loss

    def _draw_delays(self) -> tuple[np.ndarray, np.ndarray]:
        """Model-sharing and upload delays of this round; drawn for every strategy alike."""
        scale = model_sharing_scale(self.num_parties, self.per_segment_batch)
        return self.delays.draw(scale), self.delays.draw()

    def _fedvs_timing(self, share_delays: np.ndarray, upload_delays: np.ndarray) -> RoundTiming:
        return fedvs_timing(
            share_seconds=self.share_seconds,
            share_delays=share_delays,
            coded_compute_s=self.coded_compute_s,
            upload_delays=upload_delays,
            upload_seconds=self.coded_upload_s,
            threshold=self.codec.threshold,
            server_s=self.decode_s,
            download_s=self.download_s,
            update_s=self.update_s,
        )

    def _check_shortfall(self, timing: RoundTiming) -> None:
        if self.deadline_s is None:
            return
        arrived = int(np.sum(timing.arrivals <= self.deadline_s))
        if arrived >= self.codec.threshold:
            return
        if self.on_shortfall == "raise":
            raise StragglerShortfall(
                f"FedVS round {self.wire.ledger.rounds}: only {arrived} of the R = 2(K+T-1)+1 = "
                f"{self.codec.threshold} coded embeddings arrived within algo.deadline_s = "
                f"{self.deadline_s} s; set algo.on_shortfall=wait to wait for them, raise "
                f"algo.deadline_s, or lower algo.K / algo.T"
            )
        self.shortfall_rounds += 1

    def fedvs_round(self, xs, y, positions):
        """Algorithm 1 lines 13-35 for one batch; returns (loss, logits)."""
        party_opts, server_opt = self.split_optimizers()
        N = self.num_parties
        share_bits = self.codec.share_models(
            [p.weight for p in self.parties], generator=self.generator("train")
        )
        for n, bits in enumerate(share_bits):
            self.wire.ledger.record(PEER, n, (N - 1) * bits, kind="model_share")
        timing = self._fedvs_timing(*self._draw_delays())
        self._check_shortfall(timing)
        responders = list(timing.used)
        coded = self.codec.coded_embeddings(positions, clients=responders)
        received = [
            self.wire.send(
                UPLINK,
                n,
                coded[i],
                bits_per_element=self.codec.element_bits,
                kind="coded_embedding",
            )
            for i, n in enumerate(responders)
        ]
        average = self.codec.decode_average(torch.stack(received), responders)
        fused = average.to(torch.float32).requires_grad_()
        logits = self.head(fused)
        loss = self.loss_fn(logits, y)
        server_opt.zero_grad()
        self.manual_backward(loss)
        gradients = self.wire.downlink([fused.grad] * N)
        for opt, h, g in zip(party_opts, self.embed(xs), gradients, strict=True):
            opt.zero_grad()
            self.manual_backward(h, gradient=g / N)
            self.step_party(opt)
        server_opt.step()
        self._close_round(timing)
        return loss, logits

    def baseline_round(self, xs, y):
        """Wait / Ignore / Wait-DP: plain embeddings of the clients the server waits for."""
        party_opts, server_opt = self.split_optimizers()
        share_delays, upload_delays = self._draw_delays()
        deadline = None
        if self.strategy == "ignore":
            deadline = self._fedvs_timing(share_delays, upload_delays).decision_s
        timing = wait_timing(
            compute_s=self.plain_compute_s,
            upload_delays=upload_delays,
            upload_seconds=self.plain_upload_s,
            server_s=0.0,
            download_s=self.download_s,
            update_s=self.update_s,
            deadline_s=deadline,
        )
        used = sorted(timing.used)
        outputs = [self.parties[n](xs[n]) for n in used]
        if self.strategy == "wait_dp":
            gen = self.generator("train")
            outputs = [
                privatize_embedding(h, clip=self.dp_clip, sigma=self.dp_sigma, generator=gen)
                for h in outputs
            ]
        received = [
            self.wire.send(UPLINK, n, h.detach(), kind="embedding")
            for n, h in zip(used, outputs, strict=True)
        ]
        fused = torch.stack(received).mean(0).requires_grad_()
        logits = self.head(fused)
        loss = self.loss_fn(logits, y)
        server_opt.zero_grad()
        self.manual_backward(loss)
        for n, h in zip(used, outputs, strict=True):
            g = self.wire.send(DOWNLINK, n, fused.grad, kind="gradient")
            party_opts[n].zero_grad()
            self.manual_backward(h, gradient=g / len(used))
            self.step_party(party_opts[n])
        server_opt.step()
        self._close_round(timing)
        return loss, logits

    def _close_round(self, timing: RoundTiming) -> None:
        self._project_weights()
        self.wire.clock.advance(timing.duration_s)
        self.wire.end_round()
        self.log("fedvs/used_clients", float(len(timing.used)), on_step=False, on_epoch=True)
        self.log("fedvs/round_s", timing.duration_s, on_step=False, on_epoch=True)

    def _project_weights(self) -> None:
        with torch.no_grad():
            for party in self.parties:
                party.weight.clamp_(-self.weight_bound, self.weight_bound)

    # ----------------------------------------------------------------- evaluation
    def server_input(
        self, xs: Sequence[torch.Tensor], stage: str, idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Plain average of the real-valued embeddings (noisy ones for Wait-DP with dp_at_eval)."""
        embeddings = self.embed(xs)
        if self.strategy == "wait_dp" and self.dp_at_eval:
            gen = self.generator(stage)
            embeddings = [
                privatize_embedding(h, clip=self.dp_clip, sigma=self.dp_sigma, generator=gen)
                for h in embeddings
            ]
        return torch.stack(embeddings).mean(0)

    def on_validation_end(self) -> None:
        if self.trainer.sanity_checking:
            return
        acc = self.trainer.callback_metrics.get("val/acc")
        if acc is not None:
            self.val_curve.append((self.wire.ledger.rounds, self.wire.clock.now, float(acc)))

    def results(self) -> dict:
        out = super().results()
        out |= {
            "fedvs/strategy": self.strategy,
            "fedvs/K": self.K,
            "fedvs/T": self.T,
            "fedvs/R": self.codec.threshold,
            "fedvs/shortfall_rounds": self.shortfall_rounds,
            "fedvs/data_sharing_s": self.data_sharing_s,
            "fedvs/dp_sigma": self.dp_sigma,
            "fedvs/val_curve": [list(point) for point in self.val_curve],
        }
        return out

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["fedvs"] = {
            "delays": self.delays.state_dict(),
            "val_curve": list(self.val_curve),
            "shortfall_rounds": self.shortfall_rounds,
            "data_shared": self.data_shared,
            "data_sharing_s": self.data_sharing_s,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint["fedvs"]
        self.delays.load_state_dict(state["delays"])
        self.val_curve = [tuple(point) for point in state["val_curve"]]
        self.shortfall_rounds = int(state["shortfall_rounds"])
        self.data_shared = bool(state["data_shared"])
        self.data_sharing_s = float(state["data_sharing_s"])
