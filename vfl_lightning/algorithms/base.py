"""VFLModule: the shared LightningModule of every protocol (parties, head, mechanism, wire, state);
its steps, epoch metrics, evaluation and non-finite watchdog are the mixins it is made of.

Conventions: manual optimization with one optimizer per party plus one for the server head, and
``global_step`` counts *server updates* (see :class:`~vfl_lightning.algorithms.steps.ProtocolSteps`).
For synchronous protocols a server update is one communication round, so ``trainer.max_steps`` =
rounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from vfl_lightning.algorithms.epoch_metrics import EpochMetrics, make_clean_accuracy, make_metrics
from vfl_lightning.algorithms.evaluation import EVAL_STAGES, Evaluation
from vfl_lightning.algorithms.local_parties import LocalParties
from vfl_lightning.algorithms.parties import (
    Parties,
    ServerStreams,
    combined_digest,
    tensor_digest,
)
from vfl_lightning.algorithms.steps import ProtocolSteps
from vfl_lightning.algorithms.watchdog import NonFiniteWatch
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.base import Mechanism, join_own_embedding
from vfl_lightning.parallel import RowShares, rank_rows
from vfl_lightning.wire import Network, SimulatedClock, Wire

OptimizerFactory = Callable[..., torch.optim.Optimizer]


PRECISION_ALIASES = {"16": "16-mixed", "32": "32-true", "64": "64-true", "bf16": "bf16-mixed"}
"""Lightning's short names for precisions, resolved as Lightning resolves them."""


class VFLModule(EpochMetrics, NonFiniteWatch, Evaluation, ProtocolSteps):
    """Parties, the server head, the mechanism and the wire, with evaluation, logging and state.

    Subclasses implement :meth:`training_step` (the protocol). ``optimizer`` is a partial torch
    optimizer (Hydra ``_partial_: true``) completed with each party's and the head's parameters;
    ``server_optimizer`` overrides it for the head, and ``server_lr`` (``algo.server_lr``; None:
    the optimizer's lr) sets the head's learning rate alone (the server's η0 beside the parties' η).
    ``max_simulated_s`` (``algo.max_simulated_s``; None: never) ends training after the first
    training step at which the simulated clock has reached it.

    Active party (``server_party``): the label holder also holds features. Its party model embeds
    the last slice of every batch, and that fresh embedding joins the fusion at the server
    (:meth:`server_fuse`) without crossing the wire; the server optimizer steps it with the head.
    Protocols that handle it set ``SUPPORTS_ACTIVE_PARTY``.

    The parties are reached through ``self.party_side`` (:attr:`PARTY_INTERFACE`): by default
    :class:`~vfl_lightning.algorithms.local_parties.LocalParties`, which holds the party models
    (``self.parties``, submodules of this module), their optimizers and generators, and updates
    them; :meth:`attach_parties` replaces it by another transport (Ray actors).

    Data parallelism (``trainer=ddp``, protocols with ``DATA_PARALLEL``): ``self.rows`` says which
    rows of every global batch this rank's parties embed (the local parties gather the
    embeddings of all ranks, so the server side runs on the global batch, and sum the party
    gradients across ranks, :class:`~vfl_lightning.parallel.RowShares`); the server's gradient is
    rank 0's.

    ``party_widths``: each party's embedding width, as the runtime reports it (``build`` passes
    it for every runtime; the server's process may hold no party model); default: each party
    model's. Where both are given they must agree.

    ``batch_parties`` (default true): the local parties of one fully connected (or polynomial
    network) architecture and input shape are evaluated as one grouped computation
    (:class:`~vfl_lightning.models.batched.GroupedParties`).
    """

    # Capabilities: what callbacks, checks and the report ask of a protocol, declared here and
    # overridden by each protocol class (no list of algo names exists anywhere else).
    SUPPORTS_ACTIVE_PARTY = False
    """Whether the label holder may hold features too (``data.active_party=true``)."""
    DATA_PARALLEL = False
    """Whether its batches can be split over ranks (``trainer=ddp``)."""
    RUNTIMES = ("local",)
    """Where this protocol's parties may run: the ``name`` of a runtime (``conf/runtime``)."""
    PARTY_INTERFACE: type[Parties] = Parties
    """The interface the protocol reaches its parties through (a transport implements it)."""
    PARTY_ANSWERS = "gradients"
    """What the server sends a party back: ``gradients`` (dL/dh_m) or ``losses`` (zeroth-order
    clients get loss values only); :attr:`party_answers` reads it per instance."""
    RELEASE_CANARIES = False
    """Whether every training release goes through :meth:`Parties.send`, where a party puts an
    audit's message canaries into what it releases (``audit=canary_message``)."""
    CODED_MESSAGES = False
    """Whether the parties send coded shares that the server decodes only as an aggregate (FedVS),
    rather than embeddings (plain, noisy or under pairwise masks)."""
    PER_PARTY_MESSAGES = True
    """Whether the server sees each party's own message and answers each party with the gradient
    of its own embedding (false: it decodes only an aggregate and broadcasts one gradient)."""
    PARTY_SETTINGS: tuple[str, ...] = ("_target_", "name")
    """The ``algo`` settings a party checks against its own configuration before it takes part
    (``runtime=grpc``): what it must agree to, beyond the mechanism, model and optimizer."""
    PARTY_CALLS = "sync"
    """The family of calls its parties answer in their own processes (``runtime=grpc``):
    ``sync`` (messages and gradients), ``async`` (client messages and answers) or ``fedvs``."""

    @classmethod
    def party_updates_per_release(cls, settings: dict) -> int:
        """How many updates a party takes for one training release under the protocol whose
        party settings (``PARTY_SETTINGS``, a party's own configuration) are ``settings``: one."""
        return 1

    OPTED_IN = ("RUNTIMES", "DATA_PARALLEL", "RELEASE_CANARIES")
    """Capabilities a class declares itself: a subclass that does not set one gets the default
    above (``("local",)``, False), whatever its parent declares, since it may change what crosses
    the wire or what a batch's rows decide."""

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for name in cls.OPTED_IN:
            if name not in cls.__dict__:
                setattr(cls, name, getattr(VFLModule, name))

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
        server_lr: float | None = None,
        max_simulated_s: float | None = None,
        seed: int = 0,
        network: Network | None = None,
        transcript_size: int = 0,
        server_party: nn.Module | None = None,
        batch_parties: bool = True,
        party_widths: Sequence[int] | None = None,
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
                "party_widths",
            ]
        )
        self.name = name
        self.parties = nn.ModuleList(parties)
        self.head = head
        self.server_party = server_party
        self.mechanism = mechanism
        self.optimizer_factory = optimizer
        self.server_optimizer_factory = server_optimizer or optimizer
        if server_lr is not None:
            if isinstance(server_lr, bool) or not (
                isinstance(server_lr, int | float) and math.isfinite(server_lr) and server_lr > 0
            ):
                raise ValueError(
                    f"algo.server_lr must be a finite number > 0 or null, got {server_lr!r}"
                )
            self.server_optimizer_factory = partial(
                self.server_optimizer_factory, lr=float(server_lr)
            )
        if max_simulated_s is not None and not max_simulated_s > 0:
            raise ValueError(f"algo.max_simulated_s must be > 0 or null, got {max_simulated_s}")
        self.max_simulated_s = max_simulated_s
        self.num_classes = int(num_classes)
        self.seed = int(seed)
        model_widths = [int(p.embedding_dim) for p in self.parties]
        if party_widths is None:
            party_widths = model_widths
        self.widths = [int(width) for width in party_widths]
        if model_widths and model_widths != self.widths:
            raise ValueError(
                f"party_widths={self.widths} differ from the party models' embedding widths "
                f"{model_widths}"
            )
        self._num_parties = len(self.widths)
        clock = SimulatedClock(network, self._num_parties, self.seed)
        self.wire = Wire(self._num_parties, clock, transcript_size)
        self.wire.downlink_codec = self.downlink_codec()
        self.train_metrics = make_metrics(self.num_classes, "train")
        self.val_metrics = make_metrics(self.num_classes, "val")
        self.test_metrics = make_metrics(self.num_classes, "test")
        self.clean_metrics = nn.ModuleDict(
            {stage: make_clean_accuracy(self.num_classes, stage) for stage in EVAL_STAGES}
        )
        self.streams = ServerStreams(self.seed)
        self._epoch_aggregates: dict[str, tuple[list, list[float], str]] = {}
        self._epoch_predictions: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._epoch_metrics_logged = False
        self._eval_losses: list[tuple[torch.Tensor, int]] = []
        self._eval_clean = False
        self.rows = RowShares()
        self._unchecked_losses: list[tuple[torch.Tensor, int]] = []
        self._first_bad_round: int | None = None
        self.run_config: dict | None = None
        self.party_options = {"batch_parties": bool(batch_parties)}
        """What the local parties of this module are built with (a subclass building its own)."""
        self.party_side: Parties = LocalParties(
            self.parties, mechanism, self.seed, self.streams, **self.party_options
        )
        self._plain_server_steps = False

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(outputs, batch, batch_idx)
        if self.max_simulated_s is not None and self.wire.clock.now >= self.max_simulated_s:
            self.trainer.should_stop = True

    def attach_parties(self, party_side: Parties) -> None:
        """Reach the parties through ``party_side`` (e.g. Ray actors, which hold the party
        models and optimizers): the module keeps no party model of its own from then on."""
        self.parties = nn.ModuleList()
        self.party_side = party_side

    def transport_options(self) -> dict:
        """Public settings a transport of :attr:`PARTY_INTERFACE` needs from the protocol beyond
        the party factory (none for the synchronous and asynchronous families)."""
        return {}

    def downlink_codec(self):
        """The form this protocol's gradients cross in (:mod:`~vfl_lightning.wire.codecs`): the
        mechanism's by default; a protocol with another downlink returns its own codec."""
        return self.mechanism.downlink_codec()

    @classmethod
    def check_party_class(cls, party_class: type, name: str) -> None:
        """Refuse, before anything is built, a party model this protocol cannot run (``name``:
        the algo name for the message). Every party model is fine by default."""

    @property
    def num_parties(self) -> int:
        return self._num_parties

    @property
    def party_answers(self) -> str:
        """What this run's server sends its parties back (:attr:`PARTY_ANSWERS`)."""
        return self.PARTY_ANSWERS

    def server_decoder(self) -> Callable | None:
        """How the server turns what the responders of a round sent into the average its head
        reads, ``decode(responders, coded)``, when it never sees a party's own message (coded
        protocols); None when the messages arrive per party."""
        return None

    def __setattr__(self, name: str, value) -> None:
        # Lightning sets ``_current_fx_name`` (a string or None) before and after every hook it
        # calls, a dozen times per training batch; ``nn.Module.__setattr__`` first checks whether
        # the value is a parameter, module or buffer (about 6 µs a call), which such a name never is.
        if name == "_current_fx_name" and (value is None or isinstance(value, str)):
            object.__setattr__(self, name, value)
        else:
            super().__setattr__(name, value)

    SUPPORTED_PRECISION = ("32-true", "64-true", "bf16-mixed", "bf16-true")

    def setup(self, stage: str) -> None:
        self.check_precision(str(self.trainer.precision))
        self.rows = self.data_parallel_rows()
        self.party_side.use_rows(self.rows)

    def data_parallel_rows(self) -> RowShares:
        """This rank's :class:`RowShares` (:func:`~vfl_lightning.parallel.rank_rows`: refused for
        a protocol without :attr:`DATA_PARALLEL` on several ranks)."""
        return rank_rows(self.trainer, data_parallel=self.DATA_PARALLEL, name=self.name)

    @classmethod
    def check_precision(cls, precision) -> str:
        """``trainer.precision`` one of ``SUPPORTED_PRECISION`` (Lightning's short names 32, 64,
        bf16 too). Float16 AMP scales the loss, so the gradients sent over the wire would be scaled
        values: it is refused with that reason (bf16 needs no loss scaling). Asked before anything
        is built (``run.config_checks``) and again at ``setup`` (a trainer made elsewhere)."""
        name = PRECISION_ALIASES.get(str(precision), str(precision))
        if name in cls.SUPPORTED_PRECISION:
            return name
        reason = ""
        if name == "16-mixed":
            reason = (
                " (float16 AMP scales the loss, so scaled gradients would cross the wire: use bf16)"
            )
        raise ConfigError(
            f"trainer.precision must be one of {cls.SUPPORTED_PRECISION} (or 32, 64, bf16), got "
            f"{precision!r}{reason}"
        )

    # ----------------------------------------------------------------- forward
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

    def model_digest(self) -> str:
        """SHA-256 over the digests each holder reports of its own parameters
        (:func:`~vfl_lightning.algorithms.parties.combined_digest`): every party's
        :func:`tensor_digest` in party order (wherever the parties run; the server never pulls
        a party parameter), then the head's, then the server's own party model's."""
        parts = [(f"party {m}", d) for m, d in enumerate(self.party_side.party_digests())]
        parts.append(("head", tensor_digest(list(self.head.named_parameters())).hexdigest()))
        if self.server_party is not None:
            own = tensor_digest(list(self.server_party.named_parameters())).hexdigest()
            parts.append(("server_party", own))
        return combined_digest(parts)

    def party_privacy(self) -> dict:
        """What each party counted of its own releases
        (:meth:`~vfl_lightning.algorithms.party_budget.PartyBudget.spent`), for results.json:
        ``privacy/party_<m>/feature_eps`` and ``eval_feature_eps`` (``"inf"`` after a release
        without noise; left out where the party has no analysis of its noise) and
        ``privacy/party_<m>/max_row_releases`` (its most-released training row)."""
        out: dict = {}
        for m, spent in enumerate(self.party_side.privacy_spent()):
            for key in ("feature_eps", "eval_feature_eps"):
                if spent[key] is not None:
                    value = spent[key]
                    out[f"privacy/party_{m}/{key}"] = "inf" if value == math.inf else value
            out[f"privacy/party_{m}/max_row_releases"] = spent["max_row_releases"]
        return out

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["vfl"] = {
            "wire": self.wire.state_dict(),
            "mechanism": self.mechanism.state_dict(),
            "train_generator": self.streams.state(),
            "torch_rng": torch.get_rng_state(),
            "config": self.run_config,
            "parties": self.party_side_state(),
        }

    def party_side_state(self) -> dict:
        """The party side's state for a checkpoint, once the previous checkpoint is on disk (a
        party that saves its own state keeps only its newest: the server's last complete
        checkpoint is then at most this one save behind it)."""
        trainer = self._trainer
        wait = None if trainer is None else getattr(trainer.strategy.checkpoint_io, "wait", None)
        if wait is not None:
            wait()
        return self.party_side.state_dict()

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("vfl")
        if state is None:
            raise ValueError("checkpoint has no 'vfl' state: it was not written by vfl_lightning")
        self.wire.load_state_dict(state["wire"])
        self.mechanism.load_state_dict(state["mechanism"])
        self.streams.load(state["train_generator"])
        torch.set_rng_state(state["torch_rng"])
        if "parties" in state:
            self.party_side.load_state_dict(state["parties"])
