"""FedVS (Algorithm 1) and its Wait / Ignore / Wait-DP baselines on the run's simulated clock.

All four use polynomial-network parties, segment batches (|B| positions from each of K segments)
and the network's costs and stragglers (``conf/network/fedvs.yaml``); only the aggregation differs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.fedvs_parties import FedVSParties, LocalFedVSParties
from vfl_lightning.data.segments import SegmentedDataModule
from vfl_lightning.errors import RunFailure
from vfl_lightning.mechanisms.analytic_gaussian import WaitDP
from vfl_lightning.mechanisms.fedvs import CODE_SETTINGS, FedVSCodec
from vfl_lightning.mechanisms.field import DEFAULT_PRIME
from vfl_lightning.models.pn import PolynomialNetwork
from vfl_lightning.wire import DOWNLINK, PEER, UPLINK
from vfl_lightning.wire.fedvs_costs import FedVSCosts, data_sharing_seconds, fedvs_costs
from vfl_lightning.wire.stragglers import (
    RoundTiming,
    fedvs_timing,
    model_sharing_scale,
    non_straggler_deadline,
    wait_timing,
)

STRATEGIES = ("fedvs", "wait", "ignore", "wait_dp")
SHORTFALL_POLICIES = ("raise", "wait")
IGNORE_WAITS_FOR = ("fedvs", "non_stragglers")


class StragglerShortfall(RunFailure):
    """Fewer than R coded embeddings arrived by the configured deadline (algo.on_shortfall=raise)."""


class FedVSFamily(VFLModule):
    """One synchronous round per batch on the simulated clock, with ``strategy``:

    - ``fedvs``: clients share their quantized models (T masks) every round, every client uploads a
      coded embedding (eq. 5), the server decodes the exact quantized sum from the first
      R = 2(K+T-1)+1 arrivals (eqs. 6-7), and broadcasts dL/dH; each client updates its real model
      with (1/N) dL/dH through its own plaintext embedding (line 34).
    - ``wait``: plain average of all N embeddings (waits for the slowest client).
    - ``ignore``: average of what arrived by the last non-straggler's arrival (§6.2's wording,
      ``ignore_waits_for="non_stragglers"``) or by FedVS's decision in the same round (``"fedvs"``:
      same delay draws, so FedVS's rounds per simulated second); only those get a gradient.
    - ``wait_dp``: ``wait`` on embeddings privatized by ``dp`` (:class:`WaitDP`: clipped to an L2
      norm per sample plus Gaussian noise calibrated by the analytic Gaussian mechanism).

    Every party model is projected to |w| <= ``weight_bound`` after each step (the paper's bounded
    parameters, Assumption 4), which with the data range makes the overflow pre-check a guarantee.
    Time: message sizes, compute rates and the §6.2 straggler delays come from the run's
    :class:`~vfl_lightning.wire.Network` (``network=fedvs``, set by the algo files); a round lasts
    as :func:`fedvs_timing` / :func:`wait_timing` say. Clients: ``self.party_side``
    (:class:`FedVSParties`); ``fedvs/responder_counts``: how often each client decoded."""

    RUNTIMES = ("local", "ray", "grpc")
    PARTY_INTERFACE = FedVSParties
    PARTY_CALLS = "fedvs"
    PARTY_SETTINGS = ("_target_", "name", "strategy", *CODE_SETTINGS, "dp")
    PER_PARTY_MESSAGES = False
    CODED_MESSAGES = True  # the server decodes only the sum of the coded shares

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
        deadline_s: float | None = None,
        on_shortfall: str = "raise",
        data_sharing_on_clock: bool = True,
        ignore_waits_for: str = "non_stragglers",
        dp: WaitDP | None = None,
        **kwargs,
    ) -> None:
        super().__init__(parties, head, mechanism, optimizer, num_classes, name=name, **kwargs)
        for label, value, allowed in (
            ("strategy", strategy, STRATEGIES),
            ("on_shortfall", on_shortfall, SHORTFALL_POLICIES),
            ("ignore_waits_for", ignore_waits_for, IGNORE_WAITS_FOR),
        ):
            if value not in allowed:
                raise ValueError(f"algo.{label} must be one of {allowed}, got {value!r}")
        if deadline_s is not None and not deadline_s > 0:
            raise ValueError(f"algo.deadline_s must be > 0 or null, got {deadline_s}")
        if not isinstance(data_sharing_on_clock, bool):
            raise ValueError(
                f"algo.data_sharing_on_clock must be true or false, got {data_sharing_on_clock!r}"
            )
        if (strategy == "wait_dp") != (dp is not None):
            raise ValueError(
                "algo.dp (the Wait-DP noise) must be set exactly when algo.strategy=wait_dp "
                f"(use algo=fedvs_wait_dp), got strategy={strategy!r} and dp={dp!r}"
            )
        for party in self.parties:
            self.check_party_class(type(party), name)
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
        self.deadline_s, self.on_shortfall = deadline_s, on_shortfall
        self.data_sharing_on_clock = data_sharing_on_clock
        self.ignore_waits_for, self.dp = ignore_waits_for, dp
        self.val_curve: list[tuple[int, float, float]] = []
        self.shortfall_rounds, self.data_shared, self.data_sharing_s = 0, False, 0.0
        self.per_segment_batch, self.responder_counts = 0, [0] * self.num_parties
        self.costs: FedVSCosts | None = None
        parts = dict(codec=self.codec, dp=dp, weight_bound=weight_bound, coded=strategy == "fedvs")
        self.party_side: FedVSParties = LocalFedVSParties(
            self.parties, mechanism, self.seed, self.streams, **parts, **self.party_options
        )
        self.party_side.project_weights()

    def transport_options(self) -> dict:
        """The public code parameters (``codec``), Wait-DP's noise (``dp``), which the clients
        add themselves, and whether evaluation is coded too (``coded_eval``: FedVS itself)."""
        return {"codec": self.codec, "dp": self.dp, "coded_eval": self.strategy == "fedvs"}

    def server_decoder(self):
        """FedVS: the average of all clients' embeddings decoded from the coded embeddings of a
        round's responders (Algorithm 1, lines 27-30); None for the plain baselines."""
        if self.strategy != "fedvs":
            return None
        decode = self.codec.decode_average
        return lambda responders, coded: decode(torch.stack(coded).to(torch.int64), responders)

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
        self.costs = fedvs_costs(
            self.wire.clock.network,
            feature_counts=self.party_side.power_feature_counts(),
            width=self.widths[0],
            per_segment_batch=self.per_segment_batch,
            K=self.K,
            T=self.T,
            threshold=self.codec.threshold,
            element_bits=self.codec.element_bits,
        )
        if self.strategy == "fedvs":
            self.share_data()

    def share_data(self) -> None:
        """Algorithm 1 lines 1-10, once; charged to the ledger, and to the clock unless
        ``data_sharing_on_clock`` is false, on a fresh run only (a resumed run shares the same
        data shares again: the checkpoint does not carry them)."""
        bits = self.party_side.share_data(self.trainer.datamodule.splits["train"].xs)
        if self.data_shared:
            return
        for n, share_bits in enumerate(bits):
            self.wire.ledger.record(PEER, n, (self.num_parties - 1) * share_bits, kind="data_share")
        self.data_sharing_s = data_sharing_seconds(
            self.wire.clock.network,
            share_bits=bits,
            K=self.K,
            T=self.T,
            element_bits=self.codec.element_bits,
        )
        if self.data_sharing_on_clock:
            self.wire.clock.advance(self.data_sharing_s)
        self.data_shared = True

    # ----------------------------------------------------------------- one round
    def training_step(self, batch, batch_idx):
        xs, y, idx = batch
        if self.strategy == "fedvs":
            loss, logits = self.fedvs_round(xs, y, idx)
        else:
            loss, logits = self.baseline_round(xs, y, idx)
        self.log_train_step(loss, logits, y)
        if self.is_log_step():
            self.log("time/simulated_s", self.wire.clock.now, on_step=True, on_epoch=False)
        return loss

    def _draw_delays(self) -> tuple[np.ndarray, np.ndarray]:
        """Model-sharing and upload delays of this round; drawn for every strategy alike."""
        delays = self.wire.clock.delays
        scale = model_sharing_scale(self.num_parties, self.per_segment_batch)
        return delays.draw(scale), delays.draw()

    def _fedvs_timing(self, share_delays: np.ndarray, upload_delays: np.ndarray) -> RoundTiming:
        return fedvs_timing(
            share_seconds=self.costs.share_s,
            share_delays=share_delays,
            coded_compute_s=self.costs.coded_compute_s,
            upload_delays=upload_delays,
            upload_seconds=self.costs.coded_upload_s,
            threshold=self.codec.threshold,
            server_s=self.costs.decode_s,
            download_s=self.costs.download_s,
            update_s=self.costs.update_s,
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

    def fedvs_round(self, xs, y, idx):
        """Algorithm 1 lines 11-35 for one batch; returns (loss, logits)."""
        server_opt = self.server_optimizer()
        # when each coded embedding arrives on the simulated clock (lines 21-27)
        share_delays, upload_delays = self._draw_delays()
        timing = self._fedvs_timing(share_delays, upload_delays)
        self._check_shortfall(timing)
        self.share_models(share_delays)
        positions = idx[: self.per_segment_batch]
        responders, received = self.upload_coded_embeddings(positions, upload_delays, timing.used)
        # lines 28-30: interpolate psi, evaluate at beta_1..beta_K, dequantize the average
        fused = self.codec.decode_average(torch.stack(received), responders)
        fused = fused.to(torch.float32).requires_grad_()
        # line 31: the server's update, and dL/dH broadcast to every client
        logits = self.head(fused)
        loss = self.loss_fn(logits, y)
        self.zero_server(server_opt)
        self.server_backward(loss)
        gradients = self.wire.downlink([fused.grad] * self.num_parties)
        with self.answering_parties(loss):
            self.party_side.update(xs, idx, gradients[0])
        self.step_server(server_opt)
        self._close_round(timing, len(responders))
        return loss, logits

    def share_models(self, share_delays: np.ndarray) -> None:
        """Lines 13-20: each client quantizes its model and sends N-1 masked Lagrange shares."""
        share_bits = self.party_side.share_models(share_delays)
        for n, bits in enumerate(share_bits):
            self.wire.ledger.record(PEER, n, (self.num_parties - 1) * bits, kind="model_share")

    def upload_coded_embeddings(
        self, positions, upload_delays: np.ndarray, modelled: Sequence[int]
    ) -> tuple[list[int], list[torch.Tensor]]:
        """Lines 21-24, 27: the coded embeddings (eq. 5) of the first R clients reach the server;
        returns (responders, what arrived)."""
        responders, coded = self.party_side.coded_embeddings(positions, upload_delays, modelled)
        for n in responders:
            self.responder_counts[n] += 1
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
        return responders, received

    def baseline_round(self, xs, y, idx):
        """Wait / Ignore / Wait-DP: plain embeddings of the clients the server waits for."""
        server_opt = self.server_optimizer()
        share_delays, upload_delays = self._draw_delays()
        deadline = None
        if self.strategy == "ignore" and self.ignore_waits_for == "fedvs":
            deadline = self._fedvs_timing(share_delays, upload_delays).decision_s
        elif self.strategy == "ignore":
            arrivals = self.costs.plain_compute_s + upload_delays + self.costs.plain_upload_s
            deadline = non_straggler_deadline(arrivals, self.wire.clock.delays.non_stragglers)
        timing = wait_timing(
            compute_s=self.costs.plain_compute_s,
            upload_delays=upload_delays,
            upload_seconds=self.costs.plain_upload_s,
            server_s=0.0,
            download_s=self.costs.download_s,
            update_s=self.costs.update_s,
            deadline_s=deadline,
        )
        used, outputs = self.party_side.plain_round(xs, idx, upload_delays, timing.used, deadline)
        received = [
            self.wire.send(UPLINK, n, h, kind="embedding")
            for n, h in zip(used, outputs, strict=True)
        ]
        fused = torch.stack(received).mean(0).requires_grad_()
        logits = self.head(fused)
        loss = self.loss_fn(logits, y)
        self.zero_server(server_opt)
        self.server_backward(loss)
        gradient = None
        for n in used:
            gradient = self.wire.send(DOWNLINK, n, fused.grad, kind="gradient")
        with self.answering_parties(loss):
            self.party_side.update_plain(used, gradient)
        self.step_server(server_opt)
        self._close_round(timing, len(used))
        return loss, logits

    def _close_round(self, timing: RoundTiming, used: int) -> None:
        """End the round on the clock (the modelled duration) and log how many clients the
        server used (under Ray: the real arrivals, which may differ from ``timing.used``)."""
        self.wire.end_round(duration_s=timing.duration_s)
        self.accumulate_epoch("fedvs/used_clients", float(used))
        self.accumulate_epoch("fedvs/round_s", timing.duration_s)

    # ----------------------------------------------------------------- evaluation
    def server_input(
        self, xs: Sequence[torch.Tensor], stage: str, idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The average embedding: of the real-valued embeddings (noisy ones for Wait-DP with
        ``algo.dp.at_eval``), or, for FedVS under ``runtime=ray``, decoded from coded ones."""
        return self.party_side.eval_average(xs, idx, stage)

    def clean_server_input(self, xs: Sequence[torch.Tensor], stage: str) -> torch.Tensor | None:
        """Wait-DP evaluated with noise (``algo.dp.at_eval``): also the noise-free average, where
        the clients hand it over (``runtime=local`` only, see
        :meth:`FedVSParties.clean_embeddings`)."""
        if self.dp is None or not self.dp.at_eval:
            return None
        clean = self.party_side.clean_embeddings(xs)
        return None if clean is None else torch.stack(clean).mean(0)

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
            "fedvs/responder_counts": list(self.responder_counts),
            "fedvs/data_sharing_s": self.data_sharing_s,
            "fedvs/data_sharing_on_clock": self.data_sharing_on_clock,
            "fedvs/dp_sigma": 0.0 if self.dp is None else self.dp.sigma,
            "fedvs/val_curve": [list(point) for point in self.val_curve],
        }
        return out

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["fedvs"] = {
            "val_curve": list(self.val_curve),
            "shortfall_rounds": self.shortfall_rounds,
            "responder_counts": list(self.responder_counts),
            "data_shared": self.data_shared,
            "data_sharing_s": self.data_sharing_s,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint["fedvs"]
        self.val_curve = [tuple(point) for point in state["val_curve"]]
        self.shortfall_rounds = int(state["shortfall_rounds"])
        self.responder_counts = [int(c) for c in state["responder_counts"]]
        self.data_shared = bool(state["data_shared"])
        self.data_sharing_s = float(state["data_sharing_s"])
