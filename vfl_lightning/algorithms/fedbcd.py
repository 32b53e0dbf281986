"""FedBCD (Liu et al., fedbcd.txt): Q local updates on stale messages between exchanges, parallel
(FedBCD-p, Algorithm 1), sequential (FedBCD-s, Fig. 1b) and proximal (FedPBCD-p, eq. 13)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch

from vfl_lightning.algorithms.party import proximal_term
from vfl_lightning.algorithms.sync import SyncVFL
from vfl_lightning.optim import scale_lr

SCHEDULES = ("parallel", "sequential")
LR_SCHEDULES = ("constant", "sqrt_decay", "sqrt_decay_k")


def lr_factor(schedule: str, round_index: int, num_feature_parties: int) -> float:
    """η_r / η0 for exchange round r: 1, 1/√(r+1) (§VII) or 1/√((r+1)K) (§VII, K parties)."""
    if schedule == "sqrt_decay":
        return 1.0 / math.sqrt(round_index + 1)
    if schedule == "sqrt_decay_k":
        return 1.0 / math.sqrt((round_index + 1) * num_feature_parties)
    return 1.0


class FedBCD(SyncVFL):
    """FedBCD: one exchange of messages every Q iterations, local updates on stale messages between.

    One training step (one dataloader batch) is one exchange round and its Q iterations, all on the
    exchange's minibatch S, as Algorithm 1 samples S only when r mod Q = 0 and every local update
    uses g_k(I_S^{-k}, θ_k^r; S).

    - ``schedule='parallel'`` (FedBCD-p, ``algo=fedbcd``; ``algo=fedsgd`` is Q = 1): iteration 1
      is :meth:`SyncVFL.exchange_round` itself (embeddings up, gradients down, every side steps),
      so Q = 1 is the synchronous algorithm step for step. In the Q − 1 iterations that follow no
      message crosses the wire: each party recomputes h_m on S with its current parameters and
      steps with the cached gradient it received; the server steps its head (and its own party
      model) on the cached fused embeddings joined with its own fresh embedding.
    - ``schedule='sequential'`` (FedBCD-s, ``algo=fedbcd_s``): the sides update one after the
      other with the exchange split around them: embeddings up; the server takes Q steps on them;
      it then sends the gradient at its updated parameters; the parties take Q steps with it.
    - ``mu > 0`` (FedPBCD-p, ``algo=fedpbcd``): every local update adds μ(θ − θ^{r0}), θ^{r0}
      the side's parameters at the exchange (eq. 13). The paper defines it for the parallel
      schedule only.
    - ``lr_schedule``: ``constant``, ``sqrt_decay`` (η0/√(r+1)) or ``sqrt_decay_k``
      (η0/√((r+1)K), K the feature-holding parties: the wire parties plus an active server), with
      r the exchange round; set on every optimizer at the start of each round.

    Counting: ``comm/rounds`` (the ledger) counts exchanges; ``global_step`` counts server
    updates, which FedBCD makes on every iteration, so ``global_step = Q · rounds`` and
    ``trainer.max_steps`` is a number of iterations (it must be a multiple of Q).
    ``trainer.val_check_interval=k`` validates every k rounds.
    """

    DATA_PARALLEL = True
    RELEASE_CANARIES = True
    RUNTIMES = ("local", "ray", "grpc")
    PARTY_SETTINGS = ("_target_", "name", "local_steps", "schedule", "mu", "lr_schedule")

    @classmethod
    def party_updates_per_release(cls, settings: dict) -> int:
        """Q: the update with the exchanged gradient, then Q − 1 local steps (its default where
        ``settings`` leave ``local_steps`` out)."""
        default = inspect.signature(cls.__init__).parameters["local_steps"].default
        return int(settings.get("local_steps", default))

    def __init__(
        self,
        *args,
        local_steps: int = 5,
        schedule: str = "parallel",
        mu: float = 0.0,
        lr_schedule: str = "constant",
        **kwargs,
    ) -> None:
        if isinstance(local_steps, bool) or int(local_steps) != local_steps or local_steps < 1:
            raise ValueError(f"algo.local_steps (Q) must be an integer >= 1, got {local_steps!r}")
        if schedule not in SCHEDULES:
            raise ValueError(f"algo.schedule must be one of {SCHEDULES}, got {schedule!r}")
        if not mu >= 0:
            raise ValueError(f"algo.mu (proximal weight) must be >= 0, got {mu}")
        if schedule == "sequential" and mu > 0:
            raise ValueError(
                "algo.mu > 0 (the proximal term) is defined for the parallel schedule only "
                f"(FedPBCD-p, §VII); fedbcd_s needs mu = 0, got {mu}. Use algo=fedpbcd"
            )
        if lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"algo.lr_schedule must be one of {LR_SCHEDULES}, got {lr_schedule!r}")
        super().__init__(*args, **kwargs)
        self.local_steps = int(local_steps)
        self.schedule = schedule
        self.mu = float(mu)
        self.lr_schedule = lr_schedule

    def setup(self, stage: str) -> None:
        super().setup(stage)
        trainer = self.trainer
        max_steps = trainer.max_steps
        fitting = stage == "fit" and not trainer.fast_dev_run
        if fitting and max_steps > 0 and max_steps % self.local_steps:
            raise ValueError(
                "trainer.max_steps counts iterations (Q per exchange round) and must be a "
                f"multiple of algo.local_steps = {self.local_steps}, got {max_steps}"
            )

    # ------------------------------------------------------------- schedule and anchors
    @property
    def num_feature_parties(self) -> int:
        """K of the paper: the parties holding features (an active server is one of them)."""
        return self.num_parties + (self.server_party is not None)

    def apply_lr_schedule(self) -> None:
        """Set every optimizer's lr to η0 · factor(r) for the exchange round r about to start."""
        if self.lr_schedule == "constant":
            return
        factor = lr_factor(self.lr_schedule, self.wire.ledger.rounds, self.num_feature_parties)
        server_opt = self.server_optimizer()
        self.party_side.set_lr_factor(factor)
        scale_lr(server_opt.optimizer, factor)

    def proximal_anchors(self) -> list[torch.Tensor] | None:
        """θ^{r0} at the exchange: every party remembers its own; returns the server's
        (``None`` without a proximal term)."""
        if self.mu == 0:
            return None
        self.party_side.set_anchor()
        return [p.detach().clone() for p in self.server_parameters()]

    # ------------------------------------------------------------- local iterations
    def local_party_step(self, gradients: Sequence[torch.Tensor]) -> None:
        """Every party: fresh h_m on S with its current θ_m, backward with the cached g_m (plus
        μ(θ_m − θ_m^{r0})), step."""
        self.party_side.apply_gradients(gradients, fresh=True, mu=self.mu)

    def local_server_step(
        self,
        server_opt,
        fused: torch.Tensor,
        xs: Sequence[torch.Tensor],
        y: torch.Tensor,
        anchors: list[torch.Tensor] | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The server: loss on the cached fused messages joined with its own fresh embedding
        (plus the proximal term), backward, step. Returns (loss, logits)."""
        loss, logits = self.server_loss(fused, xs, y)
        objective = loss
        if anchors is not None:
            objective = loss + proximal_term(self.server_parameters(), anchors, self.mu)
        self.zero_server(server_opt)
        self.server_backward(objective)
        self.step_server(server_opt)
        return loss, logits

    # ------------------------------------------------------------- rounds
    def parallel_round(self, xs: Sequence[torch.Tensor], y: torch.Tensor, idx: torch.Tensor):
        """FedBCD-p (Algorithm 1): the exchange iteration, then Q − 1 local iterations."""
        server_opt = self.server_optimizer()
        anchors = self.proximal_anchors()
        exchanged = self.exchange_round(xs, y, idx)
        for _ in range(self.local_steps - 1):
            with self.answering_parties(exchanged.loss):
                self.local_party_step(exchanged.gradients)
            self.local_server_step(server_opt, exchanged.fused, xs, y, anchors)
        return exchanged.loss, exchanged.logits

    def sequential_round(self, xs: Sequence[torch.Tensor], y: torch.Tensor, idx: torch.Tensor):
        """FedBCD-s (Fig. 1b): embeddings up; Q server steps; gradients down; Q party steps."""
        server_opt = self.server_optimizer()
        received = self.send_embeddings(xs, idx)
        fused = self.mechanism.fuse(received).detach()
        loss, logits = self.local_server_step(server_opt, fused, xs, y, None)
        for _ in range(self.local_steps - 1):
            self.local_server_step(server_opt, fused, xs, y, None)
        leaf = fused.clone().requires_grad_()
        updated_loss, _ = self.server_loss(leaf, xs, y)
        (fused_grad,) = torch.autograd.grad(updated_loss, leaf)
        gradients = self.send_gradients(fused_grad)
        with self.answering_parties(updated_loss):
            self.update_parties(gradients)
            for _ in range(self.local_steps - 1):
                self.local_party_step(gradients)
        self.wire.end_round()
        return loss, logits

    def protocol_step(self, xs: Sequence[torch.Tensor], y: torch.Tensor, idx: torch.Tensor):
        """One exchange round and its Q iterations; returns the exchange iteration's (loss, logits)."""
        self.apply_lr_schedule()
        if self.schedule == "sequential":
            return self.sequential_round(xs, y, idx)
        return self.parallel_round(xs, y, idx)

    def results(self) -> dict:
        out = super().results()
        out["algo/local_steps"] = self.local_steps
        return out
