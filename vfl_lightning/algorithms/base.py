"""VFLModule: the shared LightningModule of every protocol (parties, head, wire, metrics, state).

Conventions: manual optimization with one optimizer per party plus one for the server head, and
``global_step`` counts *server updates*: only the server optimizer steps through Lightning's
wrapper, party optimizers step the wrapped torch optimizer directly. For synchronous protocols a
server update is one communication round, so ``trainer.max_steps`` = rounds.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torchmetrics import MetricCollection
from torchmetrics.classification import (
    BinaryAccuracy,
    BinaryAUROC,
    BinaryAveragePrecision,
    MulticlassAccuracy,
)

from vfl_lightning import lightning_speedups
from vfl_lightning.algorithms.local_parties import LocalParties
from vfl_lightning.algorithms.parties import Parties, tensor_digest
from vfl_lightning.errors import ConfigError, NonFiniteLoss
from vfl_lightning.mechanisms.base import Mechanism, fuse_tensors, join_own_embedding
from vfl_lightning.models.batched import GroupedParties, groupable
from vfl_lightning.optim import step_together, zero_together
from vfl_lightning.parallel import FederationDDPStrategy, RowShares
from vfl_lightning.seeding import seeded_generator
from vfl_lightning.wire import Network, SimulatedClock, Wire

OptimizerFactory = Callable[..., torch.optim.Optimizer]
EVAL_STAGES = ("val", "test")

lightning_speedups.install()


def make_metrics(num_classes: int, stage: str) -> MetricCollection:
    """Accuracy for every task; AUROC and AUPRC (average precision) too for binary eval stages.

    Not synchronized across processes: with ``trainer=ddp`` every rank scores the whole global
    batch (see :class:`~vfl_lightning.parallel.RowShares`), so its metrics are already complete.
    """
    local = {"sync_on_compute": False}
    if num_classes == 2:
        metrics = {"acc": BinaryAccuracy(**local)}
        if stage != "train":
            metrics |= {"auroc": BinaryAUROC(**local), "auprc": BinaryAveragePrecision(**local)}
    else:
        metrics = {"acc": MulticlassAccuracy(num_classes=num_classes, average="micro", **local)}
    return MetricCollection(metrics, prefix=f"{stage}/")


def make_clean_accuracy(num_classes: int, stage: str) -> MetricCollection:
    """``{stage}/acc_clean``: accuracy of the noise-free server input (see ``clean_server_input``)."""
    accuracy = (
        BinaryAccuracy()
        if num_classes == 2
        else MulticlassAccuracy(num_classes=num_classes, average="micro")
    )
    return MetricCollection({"acc_clean": accuracy}, prefix=f"{stage}/")


class VFLModule(L.LightningModule):
    """Parties, the server head, the mechanism and the wire, with evaluation, logging and state.

    Subclasses implement :meth:`training_step` (the protocol). ``optimizer`` is a partial torch
    optimizer (Hydra ``_partial_: true``) completed with each party's and the head's parameters;
    ``server_optimizer`` overrides it for the head.

    Active party (``server_party``): the label holder also holds features. Its party model embeds
    the last slice of every batch, and that fresh embedding joins the fusion at the server
    (:meth:`server_fuse`) without crossing the wire; the server optimizer steps it with the head.
    Protocols that handle it set ``SUPPORTS_ACTIVE_PARTY``.

    Data parallelism (``trainer=ddp``, protocols with ``DATA_PARALLEL``): ``self.rows`` says which
    rows of every global batch this rank's parties embed; :meth:`embed` gathers the embeddings of
    all ranks, so the server side runs on the global batch, and :meth:`backward_parties` sums the
    party gradients across ranks (:class:`~vfl_lightning.parallel.RowShares`).

    ``batch_parties`` (default true): parties of one fully connected architecture and input
    shape are evaluated as one grouped computation (:class:`~vfl_lightning.models.batched.GroupedParties`);
    they stay separate modules with separate optimizers and checkpoint keys. Uneven parties, or
    other party models, run in a loop.
    """

    SUPPORTS_ACTIVE_PARTY = False
    DATA_PARALLEL = False
    RUNTIMES = ("local",)
    """Where this protocol's parties may run (``runtime=...``)."""
    PARTY_INTERFACE: type[Parties] = Parties
    """The interface the protocol reaches its parties through (a transport implements it)."""

    def __init__(
        self,
        parties: Sequence[nn.Module],
        head: nn.Module,
        mechanism: Mechanism,
        optimizer: OptimizerFactory,
        num_classes: int,
        *,
        name: str = "vfl",
        server_optimizer: OptimizerFactory | None = None,
        seed: int = 0,
        network: Network | None = None,
        transcript_size: int = 0,
        server_party: nn.Module | None = None,
        batch_parties: bool = True,
    ) -> None:
        super().__init__()
        if server_party is not None and not self.SUPPORTS_ACTIVE_PARTY:
            raise ValueError(
                f"{type(self).__name__} does not support data.active_party=true "
                "(a label holder with its own features)"
            )
        self.automatic_optimization = False
        self.save_hyperparameters(
            ignore=[
                "parties",
                "head",
                "mechanism",
                "optimizer",
                "server_optimizer",
                "network",
                "server_party",
            ]
        )
        self.name = name
        self.parties = nn.ModuleList(parties)
        self.head = head
        self.server_party = server_party
        self.mechanism = mechanism
        self.optimizer_factory = optimizer
        self.server_optimizer_factory = server_optimizer or optimizer
        self.num_classes = int(num_classes)
        self.seed = int(seed)
        self.widths = [int(p.embedding_dim) for p in self.parties]
        grouped = bool(batch_parties) and groupable(self.parties)
        self.grouped_parties = GroupedParties(self.parties) if grouped else None
        self._last_grouped: tuple[torch.Tensor | None, tuple[torch.Tensor, ...]] = (None, ())
        self._num_parties = len(self.parties)
        clock = SimulatedClock(network, len(self.parties), self.seed)
        self.wire = Wire(len(self.parties), clock, transcript_size)
        self.train_metrics = make_metrics(self.num_classes, "train")
        self.val_metrics = make_metrics(self.num_classes, "val")
        self.test_metrics = make_metrics(self.num_classes, "test")
        self.clean_metrics = nn.ModuleDict(
            {stage: make_clean_accuracy(self.num_classes, stage) for stage in EVAL_STAGES}
        )
        self._generators: dict[str, torch.Generator] = {}
        self._pending_generator_state: torch.Tensor | None = None
        self._epoch_aggregates: dict[str, tuple[list, list[float], str]] = {}
        self._epoch_predictions: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._epoch_metrics_logged = False
        self._eval_losses: list[tuple[torch.Tensor, int]] = []
        self._eval_clean = False
        self.rows = RowShares()
        self._unchecked_losses: list[tuple[torch.Tensor, int]] = []
        self._first_bad_round: int | None = None
        self.run_config: dict | None = None
        self.party_side: Parties = LocalParties(self)
        self._plain_server_steps = False

    def attach_parties(self, party_side: Parties) -> None:
        """Reach the parties through ``party_side`` (e.g. Ray actors, which hold the party
        models and optimizers): the module keeps no party model of its own from then on."""
        self.parties = nn.ModuleList()
        self.party_side = party_side

    def transport_options(self) -> dict:
        """Public settings a transport of :attr:`PARTY_INTERFACE` needs from the protocol beyond
        the party factory (none for the synchronous and asynchronous families)."""
        return {}

    @classmethod
    def check_party_class(cls, party_class: type, name: str) -> None:
        """Refuse, before anything is built, a party model this protocol cannot run (``name``:
        the algo name for the message). Every party model is fine by default."""

    @property
    def num_parties(self) -> int:
        return self._num_parties

    def __setattr__(self, name: str, value) -> None:
        # Lightning sets ``_current_fx_name`` (a string or None) before and after every hook it
        # calls, a dozen times per training batch; ``nn.Module.__setattr__`` first checks whether
        # the value is a parameter, module or buffer (about 6 µs a call), which such a name never is.
        if name == "_current_fx_name" and (value is None or isinstance(value, str)):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    # ----------------------------------------------------------------- optimizers
    def configure_optimizers(self):
        party_opts = [self.optimizer_factory(p.parameters()) for p in self.parties]
        return [*party_opts, self.server_optimizer_factory(self.server_parameters())]

    def server_parameters(self) -> list[nn.Parameter]:
        """What the server optimizer steps: the head, and the server's own party model if any."""
        own = [] if self.server_party is None else list(self.server_party.parameters())
        return [*self.head.parameters(), *own]

    def split_optimizers(self):
        """(party optimizers, server optimizer), all as Lightning wrappers."""
        opts = self.optimizers()
        opts = opts if isinstance(opts, list) else [opts]
        return opts[:-1], opts[-1]

    def backward_parties(
        self, embeddings: Sequence[torch.Tensor], gradients: Sequence[torch.Tensor | None]
    ) -> None:
        """Every party's cut-layer backward, ``h_m.backward(gradient=g_m)``, in one engine call.

        The surrogate sum_m <h_m, g_m> (g_m constant) has gradient J_m^T g_m for party m's
        parameters, exactly what M separate ``manual_backward(h_m, gradient=g_m)`` calls compute
        (d<h, g>/dh = g bit for bit), at the cost of one autograd pass instead of M. Parties whose
        gradient is ``None`` are skipped. The gradient g_m arrived over the wire as plain values,
        so this pass is plain autograd: no loss scaling applies to it (see ``check_precision``).
        Data-parallel ranks each hold their rows' part of the party gradients; they are summed
        across ranks here, before any party optimizer steps.
        """
        stacked, views = self._last_grouped
        if (
            len(embeddings) == len(views)
            and all(h is v for h, v in zip(embeddings, views, strict=True))
            and all(g is not None for g in gradients)
        ):
            # grouped parties: one backward from the stacked (M, B, P) output, the same
            # gradient stack(g_m) reaches it as through the M views
            self._last_grouped = (None, ())
            torch.autograd.backward(stacked, grad_tensors=torch.stack(list(gradients)))
            self._sum_party_gradients()
            return
        terms = [(h * g).sum() for h, g in zip(embeddings, gradients, strict=True) if g is not None]
        if terms:
            torch.autograd.backward(torch.stack(terms).sum())
            self._sum_party_gradients()

    def _sum_party_gradients(self) -> None:
        """Data-parallel: sum the party gradients across ranks (the grouped parties' stacked
        gradients handed to the parties first, see :class:`GroupedParties`)."""
        if not self.rows.parallel:
            return
        if self.grouped_parties is not None:
            self.grouped_parties.distribute_gradients()
        self.rows.sum_gradients(self.parties.parameters())

    SERVER_HOOKS = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")
    """The Lightning hooks that run around the server's backward and optimizer step."""

    def plain_server_steps(self) -> bool:
        """Whether the server's backward and step can skip Lightning's dispatch (decided once per
        fit, in :meth:`on_fit_start`).

        ``manual_backward`` and ``LightningOptimizer.step`` route through the strategy and the
        precision plugin and dispatch the hooks of :attr:`SERVER_HOOKS` to every callback, about
        0.25 ms per server update, as much as a small model's whole step. On one device with
        32-bit precision, no profiler, and no callback or module overriding those hooks, that
        route does exactly ``loss.backward()`` and ``optimizer.step()``, so
        :meth:`server_backward` and :meth:`step_server` do just that (``global_step`` counted as
        Lightning counts it). Anything else takes Lightning's route.
        """
        from lightning.pytorch.plugins.precision import Precision
        from lightning.pytorch.profilers import PassThroughProfiler
        from lightning.pytorch.strategies import SingleDeviceStrategy
        from lightning.pytorch.utilities.model_helpers import is_overridden

        trainer = self.trainer
        module_hooks = any(
            getattr(type(self), hook) is not getattr(VFLModule, hook) for hook in self.SERVER_HOOKS
        )
        callback_hooks = any(
            is_overridden(hook, callback, parent=L.Callback)
            for callback in trainer.callbacks
            for hook in self.SERVER_HOOKS
        )
        return (
            type(trainer.strategy) is SingleDeviceStrategy
            and type(trainer.precision_plugin) is Precision
            and isinstance(trainer.profiler, PassThroughProfiler)
            and not self.rows.parallel
            and not module_hooks
            and not callback_hooks
        )

    def on_fit_start(self) -> None:
        self._plain_server_steps = self.plain_server_steps()

    def server_backward(self, loss: torch.Tensor) -> None:
        """The server's backward of ``loss``: ``manual_backward`` (see :meth:`plain_server_steps`)."""
        if self._plain_server_steps:
            loss.backward()
        else:
            self.manual_backward(loss)

    def zero_server(self, optimizer) -> None:
        """``zero_grad()`` of the Lightning-wrapped server ``optimizer`` (gradients set to None,
        as torch does by default), without the optimizer's dispatch on the plain route (see
        :meth:`plain_server_steps`)."""
        if self._plain_server_steps:
            zero_together([optimizer.optimizer])
        else:
            optimizer.zero_grad()

    def step_server(self, optimizer) -> None:
        """One server update with the Lightning-wrapped ``optimizer``; advances ``global_step``
        (see :meth:`plain_server_steps`). On the plain route a plain SGD optimizer steps as one
        foreach update (:func:`~vfl_lightning.optim.step_together`, the same
        values as its own ``step``)."""
        if not self._plain_server_steps:
            optimizer.step()
            return
        # the progress counting Lightning's manual-optimization loop injects around every step
        optimizer._on_before_step()
        if not step_together([optimizer.optimizer]):
            optimizer.optimizer.step()
        optimizer._on_after_step()

    def on_before_optimizer_step(self, optimizer) -> None:
        """Only the server optimizer steps through Lightning (module docstring), so this runs
        before every server update: data-parallel ranks take rank 0's server gradient."""
        if self.rows.parallel:
            self.rows.broadcast_gradients(self.server_parameters())

    def zero_party_gradients(self, optimizers) -> None:
        """``zero_grad()`` of the party ``optimizers`` (gradients set to None), and of the grouped
        parties' stacked gradients."""
        zero_together([opt.optimizer for opt in optimizers])
        if self.grouped_parties is not None:
            self.grouped_parties.zero_grad()

    @staticmethod
    def step_party(optimizer) -> None:
        """Step a party optimizer without advancing ``global_step`` (see module docstring); a
        plain SGD one as a foreach update (:func:`step_together`, the same values)."""
        if not step_together([optimizer.optimizer]):
            optimizer.optimizer.step()

    def step_parties(self, optimizers) -> None:
        """Step every party optimizer in ``optimizers`` (without advancing ``global_step``).
        Grouped parties with plain SGD optimizers of one set of hyperparameters: one foreach
        update of the stacked parameters (:meth:`GroupedParties.step`); otherwise the stacked
        gradients go to the parties, then one foreach update over every party's parameters
        (:func:`~vfl_lightning.optim.step_together`) or one step per party."""
        plain = [opt.optimizer for opt in optimizers]
        grouped = self.grouped_parties
        if grouped is not None:
            if grouped.step(plain):
                return
            grouped.distribute_gradients()
        if not step_together(plain):
            for opt in optimizers:
                self.step_party(opt)

    SUPPORTED_PRECISION = ("32-true", "64-true", "bf16-mixed", "bf16-true")

    def setup(self, stage: str) -> None:
        self.check_precision(str(self.trainer.precision))
        self.rows = self.data_parallel_rows()

    def data_parallel_rows(self) -> RowShares:
        """This rank's :class:`RowShares` under ``trainer=ddp``; refuse any other multi-process
        strategy, and data parallelism for protocols that cannot split their batches."""
        trainer = self.trainer
        strategy = trainer.strategy
        if trainer.world_size == 1 and not isinstance(strategy, DDPStrategy):
            return RowShares()
        if not self.DATA_PARALLEL:
            raise ValueError(
                f"algo={self.name} cannot run data-parallel (trainer.devices x num_nodes = "
                f"{trainer.world_size}, strategy {type(strategy).__name__}): its protocol state is "
                "not a function of each batch's rows; only the synchronous family (splitnn, npq, "
                "pbm, ldp, fedsgd, fedbcd, fedbcd_s, fedpbcd) supports trainer=ddp. Use "
                "trainer.devices=1 without a DDP strategy"
            )
        if not isinstance(strategy, FederationDDPStrategy):
            raise ValueError(
                f"strategy {type(strategy).__name__} with {trainer.world_size} process(es) would "
                "not reduce the party gradients (their backward bypasses DistributedDataParallel): "
                "use trainer=ddp (vfl_lightning.parallel.FederationDDPStrategy)"
            )
        return RowShares(trainer.world_size, trainer.global_rank)

    @classmethod
    def check_precision(cls, precision: str) -> None:
        """Float16 AMP scales the loss, so the gradients sent over the wire would be scaled
        values: refuse it (bf16 needs no loss scaling). Asked before anything is built
        (``run.checks``) and again at ``setup`` (a trainer made elsewhere)."""
        if precision not in cls.SUPPORTED_PRECISION:
            raise ConfigError(
                f"trainer.precision must be one of {cls.SUPPORTED_PRECISION}, got {precision!r} "
                "(float16 AMP scales the loss, so scaled gradients would cross the wire)"
            )

    # ----------------------------------------------------------------- randomness
    def generator(self, stage: str) -> torch.Generator:
        """The seeded generator of ``stage`` on this module's device.

        The training stream is saved in checkpoints; evaluation streams restart from the same seed
        at every evaluation epoch, so evaluation never shifts training randomness.
        """
        gen = self._generators.get(stage)
        if gen is None or gen.device != self.device:
            gen = seeded_generator(self.seed, "server", stage, device=self.device)
            if stage == "train" and self._pending_generator_state is not None:
                gen.set_state(self._pending_generator_state)
                self._pending_generator_state = None
            self._generators[stage] = gen
        return gen

    def _restart_eval_generator(self, stage: str) -> None:
        self._generators.pop(stage, None)

    def _start_evaluation(self, stage: str) -> None:
        self._eval_losses.clear()
        self._eval_clean = False
        for metrics in (getattr(self, f"{stage}_metrics"), self.clean_metrics[stage]):
            metrics.reset()

    def on_validation_epoch_start(self) -> None:
        self._start_evaluation("val")
        self._restart_eval_generator("val")
        self.party_side.restart_stream("val")
        self.mechanism.begin_evaluation(self.release_stream("val"), self.wire.ledger.rounds)

    def on_test_epoch_start(self) -> None:
        self._start_evaluation("test")
        self._restart_eval_generator("test")
        self.party_side.restart_stream("test")
        self.mechanism.begin_evaluation("test", self.wire.ledger.rounds)

    # ----------------------------------------------------------------- forward
    def embed(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each party's embedding of its slice: h_m = party_m(x_m) (not the server's own slice).

        Homogeneous parties (``batch_parties`` and :func:`~vfl_lightning.models.batched.groupable`)
        run as one grouped computation; the embeddings are then views of one (M, B, P) tensor
        (each with its own gradient path to its own party's parameters).
        Data-parallel: each rank's parties embed the rank's rows, and the result is gathered into
        the global batch (gradients flow back to the rank's own rows).
        """
        wire_xs = xs[:-1] if self.server_party is not None else xs
        shares = self.rows.take(wire_xs)
        if self.grouped_parties is not None and len({x.shape[0] for x in shares}) == 1:
            stacked = self.grouped_parties(shares)
            local = list(stacked.unbind(0))
            if stacked.requires_grad:
                self._last_grouped = (stacked, tuple(local))
        else:
            local = [party(x) for party, x in zip(self.parties, shares, strict=True)]
        return self.rows.gather(local, int(wire_xs[0].shape[0]))

    def own_embedding(self, xs: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """The active server's fresh embedding of its own (last) slice, or ``None``."""
        return None if self.server_party is None else self.server_party(xs[-1])

    def server_fuse(self, fused: torch.Tensor, own: torch.Tensor | None) -> torch.Tensor:
        """The head's input: what arrived over the wire, joined with the server's own embedding."""
        if own is None:
            return fused
        return join_own_embedding(fused, own, self.mechanism.fusion, self.num_parties)

    def forward(self, xs: Sequence[torch.Tensor], idx: torch.Tensor | None = None) -> torch.Tensor:
        """Logits as the deployed protocol computes them (mechanism applied per ``apply_at_eval``,
        on the ``predict`` release stream)."""
        return self.head(self.server_input(xs, "predict", idx))

    @staticmethod
    def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, y)

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """What the metrics see: P(class 1) for binary tasks, logits otherwise."""
        return logits.softmax(-1)[:, 1] if self.num_classes == 2 else logits

    # ----------------------------------------------------------------- logging
    def is_log_step(self) -> bool:
        """Whether this training batch is one whose step metrics Lightning writes to the loggers:
        every ``trainer.log_every_n_steps`` batches (``global_step`` counts them once the server
        has stepped; the last batch of a stopping run too)."""
        every = self.trainer.log_every_n_steps
        return every > 0 and (self.global_step % every == 0 or self.trainer.should_stop)

    def accumulate_epoch(self, name: str, value, weight: float = 1.0, reduce: str = "mean") -> None:
        """Record ``value`` (a 0-dim tensor or a number) for the epoch aggregate ``name``, the
        ``weight``-ed ``mean`` or the ``max`` of the epoch's values. A step only appends (no
        tensor operation, no host sync); :meth:`log_epoch_metrics` reduces and logs each
        aggregate once."""
        if reduce not in ("mean", "max"):
            raise ValueError(f"reduce must be 'mean' or 'max', got {reduce!r}")
        entry = self._epoch_aggregates.get(name)
        if entry is None:
            entry = self._epoch_aggregates[name] = ([], [], reduce)
        elif entry[2] != reduce:
            raise ValueError(f"epoch aggregate {name!r} is a {entry[2]}, not a {reduce}")
        entry[0].append(value.detach() if isinstance(value, torch.Tensor) else value)
        entry[1].append(float(weight))

    def epoch_aggregate(self, name: str) -> torch.Tensor:
        """The current value of the epoch aggregate ``name`` (weighted mean or max), 0-dim."""
        values, weights, reduce = self._epoch_aggregates[name]
        if all(isinstance(v, torch.Tensor) for v in values):
            stacked = torch.stack([v.reshape(()) for v in values]).to(self.device, torch.float32)
        else:
            stacked = torch.tensor([float(v) for v in values], device=self.device)
        if reduce == "max":
            return stacked.max()
        weight = torch.tensor(weights, dtype=torch.float32, device=self.device)
        return (stacked * weight).sum() / weight.sum()

    def log_train_step(self, loss: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> None:
        """``train/loss`` on logging steps only; the epoch means (``train/loss_epoch``,
        ``train/*`` metrics, mechanism stats) are recorded as they are and logged once per
        epoch, so a step costs no ``self.log`` call, no metric update and no host sync between
        logging steps."""
        loss = loss.detach()
        if self.is_log_step():
            self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        batch_size = int(y.shape[0])
        self.accumulate_epoch("train/loss_epoch", loss, batch_size)
        self._epoch_predictions.append((logits.detach(), y))
        for key, value in self.mechanism.stats.items():
            self.accumulate_epoch(key, value, batch_size)

    def communication_metrics(self) -> dict[str, float]:
        ledger = self.wire.ledger
        up, down, peer = (ledger.megabytes(d) for d in ("up", "down", "peer"))
        return {
            "comm/uplink_mb": up,
            "comm/downlink_mb": down,
            "comm/total_mb": up + down + peer,
            "comm/rounds": float(ledger.rounds),
            "comm/serialized_mb": ledger.serialized_bytes / 1e6,
            "time/simulated_s": float(self.wire.clock.now),
        }

    def on_train_epoch_start(self) -> None:
        self._epoch_aggregates.clear()
        self._epoch_predictions.clear()
        self._epoch_metrics_logged = False

    def on_train_epoch_end(self) -> None:
        if not self._epoch_metrics_logged:  # an epoch cut short (e.g. by max_steps)
            self.log_epoch_metrics()

    def log_epoch_metrics(self) -> None:
        """Every epoch metric, logged once: communication, the step aggregates, ``train/*``.

        Called from the epoch's last batch, so callbacks' ``on_train_epoch_end`` (which Lightning
        runs before the module's, e.g. the cost-to-target tracker) see this epoch's values."""
        self._epoch_metrics_logged = True
        self.log_dict(self.communication_metrics(), on_step=False, on_epoch=True)
        for name in self._epoch_aggregates:
            self.log(name, self.epoch_aggregate(name), on_step=False, on_epoch=True)
        self._epoch_aggregates.clear()
        if self._epoch_predictions:
            logits, y = (torch.cat(part) for part in zip(*self._epoch_predictions, strict=True))
            self._epoch_predictions.clear()
            self.train_metrics.update(self.scores(logits), y)
            self.log_dict(self.train_metrics.compute(), on_step=False, on_epoch=True, prog_bar=True)
        self.train_metrics.reset()

    def results(self) -> dict:
        """Protocol totals for results.json (extended by subclasses)."""
        out = self.communication_metrics()
        out["comm/peer_mb"] = self.wire.ledger.megabytes("peer")
        return out

    # ----------------------------------------------------------------- non-finite values
    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        """Log the epoch metrics after the epoch's last batch; keep each step's loss with its
        round (no tensor operation, no host sync per step) and check them every
        ``log_every_n_steps`` server updates (and, with the parameters, before every
        checkpoint)."""
        trainer = self.trainer
        if trainer.is_last_batch:
            self.log_epoch_metrics()
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._unchecked_losses.append((loss.detach(), self.wire.ledger.rounds - 1))
        if trainer.global_step % max(1, trainer.log_every_n_steps) == 0:
            self.check_finite(parameters=False)

    def first_bad_round(self) -> int | None:
        """The first round whose training loss was non-finite (checking the losses kept since
        the last check, one host sync), or None."""
        if self._first_bad_round is None and self._unchecked_losses:
            values = torch.cat([loss.reshape(-1) for loss, _ in self._unchecked_losses])
            bad = ~torch.isfinite(values)
            if bool(bad.any()):
                ends = list(
                    itertools.accumulate(loss.numel() for loss, _ in self._unchecked_losses)
                )
                entry = bisect.bisect_right(ends, int(bad.nonzero()[0, 0]))
                self._first_bad_round = self._unchecked_losses[entry][1]
            self._unchecked_losses.clear()
        return self._first_bad_round

    def check_finite(self, parameters: bool = True) -> None:
        """Raise :class:`NonFiniteLoss` naming the round if a loss or (``parameters``) a model
        parameter is non-finite. The periodic check during training looks at the losses only (a
        non-finite parameter makes the next loss non-finite); checkpoints and the end of training
        check the parameters too."""
        bad_round = self.first_bad_round()
        what = "the training loss"
        if bad_round is None:
            if not parameters:
                return
            finite = torch.stack([torch.isfinite(p).all() for p in self.parameters()]).all()
            if bool(finite):
                return
            bad_round, what = self.wire.ledger.rounds - 1, "a model parameter"
        lr = ""
        if self._trainer is not None and self.trainer.optimizers:
            lr = f" (optimizer.lr={self.trainer.optimizers[-1].param_groups[0]['lr']:g})"
        raise NonFiniteLoss(
            f"training stopped: {what} became non-finite at round {bad_round}; the likely cause "
            f"is a learning rate{lr} too large for this model; the last checkpoint written "
            "before it is kept"
        )

    # ----------------------------------------------------------------- evaluation
    def release_stream(self, stage: str) -> str:
        """The mechanism's release stream of an evaluation ``stage``: the sanity check's
        validation batches get their own (``sanity``), so they never share masks with ``val``."""
        trainer = self._trainer
        if stage == "val" and trainer is not None and trainer.sanity_checking:
            return "sanity"
        return stage

    def server_input(
        self, xs: Sequence[torch.Tensor], stage: str, idx: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The head's input at evaluation: every party sends its release of the next round of
        the stage's stream (or its plain embedding without ``apply_at_eval``), the server fuses."""
        round = self.mechanism.next_release(self.release_stream(stage))
        messages = self.party_side.send(xs, idx, stage=stage, round=round)
        fused = self.mechanism.fuse_evaluation(messages, round)
        return self.server_fuse(fused, self.own_embedding(xs))

    def clean_server_input(self, xs: Sequence[torch.Tensor], stage: str) -> torch.Tensor | None:
        """The noise-free server input (the plain fusion of the clean embeddings, as the PBM
        authors' code evaluates) when evaluation is perturbed, else ``None``.

        Evaluation is perturbed when a noisy mechanism (PBM, LDP) applies at evaluation; its
        accuracy is then also logged as ``{stage}/acc_clean`` beside the deployed ``{stage}/acc``.
        No randomness is drawn, so the evaluation noise stream is unchanged.
        """
        if not (self.mechanism.noisy and self.mechanism.apply_at_eval):
            return None
        fused = fuse_tensors(self.embed(xs), self.mechanism.fusion)
        return self.server_fuse(fused, self.own_embedding(xs))

    def _eval_step(self, batch, stage: str) -> None:
        """One evaluation batch: the deployed logits' loss and metric updates (and the clean
        metrics' when evaluation is perturbed), kept for :meth:`log_evaluation`."""
        xs, y, idx = batch
        logits = self.head(self.server_input(xs, stage, idx))
        self._eval_losses.append((self.loss_fn(logits, y).detach(), int(y.shape[0])))
        getattr(self, f"{stage}_metrics").update(self.scores(logits), y)
        clean = self.clean_server_input(xs, stage)
        if clean is not None:
            self.clean_metrics[stage].update(self.scores(self.head(clean)), y)
            self._eval_clean = True

    def log_evaluation(self, stage: str) -> None:
        """Log the evaluation epoch once: ``{stage}/loss`` (the batch-size weighted mean of the
        batch losses, as ``self.log(..., on_epoch=True)`` of every batch would give), the
        ``{stage}/*`` metrics and, when evaluation was perturbed, ``{stage}/acc_clean``. One
        ``self.log`` per key per epoch rather than per batch (each costs a Lightning dispatch)."""
        if not self._eval_losses:
            return
        losses = torch.stack([loss.reshape(()) for loss, _ in self._eval_losses])
        sizes = torch.tensor([n for _, n in self._eval_losses], dtype=losses.dtype).to(losses)
        self._eval_losses.clear()
        val = stage == "val"
        self.log(f"{stage}/loss", (losses * sizes).sum() / sizes.sum(), prog_bar=val)
        metrics = getattr(self, f"{stage}_metrics")
        self.log_dict(metrics.compute(), prog_bar=val)
        metrics.reset()
        if self._eval_clean:
            self._eval_clean = False
            self.log_dict(self.clean_metrics[stage].compute())
            self.clean_metrics[stage].reset()

    def validation_step(self, batch, batch_idx) -> None:
        self._eval_step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        self.log_evaluation("val")

    def test_step(self, batch, batch_idx) -> None:
        self._eval_step(batch, "test")

    def on_test_epoch_end(self) -> None:
        self.log_evaluation("test")

    def model_digest(self) -> str:
        """SHA-256 of every parameter tensor (name, dtype, shape, bytes): parties 0..M−1 (wherever
        they run), the head, then the server's own party model."""
        named = list(self.party_side.named_parameters())
        named += [(f"head.{n}", p) for n, p in self.head.named_parameters()]
        if self.server_party is not None:
            named += [(f"server_party.{n}", p) for n, p in self.server_party.named_parameters()]
        return tensor_digest(named).hexdigest()

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        train_gen = self._generators.get("train")
        checkpoint["vfl"] = {
            "wire": self.wire.state_dict(),
            "mechanism": self.mechanism.state_dict(),
            "train_generator": None if train_gen is None else train_gen.get_state(),
            "torch_rng": torch.get_rng_state(),
            "config": self.run_config,
            "parties": self.party_side.state_dict(),
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("vfl")
        if state is None:
            raise ValueError("checkpoint has no 'vfl' state: it was not written by vfl_lightning")
        self.wire.load_state_dict(state["wire"])
        self.mechanism.load_state_dict(state["mechanism"])
        self._generators.pop("train", None)
        self._pending_generator_state = state["train_generator"]
        torch.set_rng_state(state["torch_rng"])
        if "parties" in state:
            self.party_side.load_state_dict(state["parties"])
