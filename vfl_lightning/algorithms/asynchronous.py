"""Asynchronous VFL with zeroth- or first-order clients and server: cascade (ZOO clients, FOO
server; cascaded-hybrid paper Algorithm 1), zoo_vfl, syn_zoo_vfl (Appendix B) and vafl."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.algorithms.base import VFLModule
from vfl_lightning.algorithms.staleness import ClientActivation, EmbeddingTable
from vfl_lightning.algorithms.zoo import (
    ZOO_SPACES,
    ZooSettings,
    batch_losses,
    check_zoo_options,
    evaluate_at,
    evaluation_parameters,
    flat_parameters,
    perturbed_outputs,
    sample_directions,
    set_gradient,
    two_point_estimate,
)
from vfl_lightning.mechanisms.plain import Plain
from vfl_lightning.wire.ledger import DOWNLINK, UPLINK

UPDATES = ("zoo", "foo")
EPOCHS = ("client_pass", "server_iterations")
LOSS_BITS = 64
INITIAL_PASS_CHUNK = 1024


class HybridVFL(VFLModule):
    """Clients update by zeroth-order (``client_update='zoo'``) or first-order (``'foo'``)
    optimization, the server likewise (``server_update``); one client per server iteration
    (asynchronous, order from ``client_speeds`` or ``activation_order``) or all of them
    (``synchronous=True``).

    One server iteration (Algorithm 1) with client m active on batch B, one method per step:
    1. the client's message (:meth:`Parties.client_messages`, wherever the parties run): a ZOO
       client sends c = F_m(w_m; x) and c_hat_k = F_m(w_m + mu u_k; x), k = 1..q (eq. 2,
       ``zoo_space='params'``) or c_hat_k = c + mu u_k (``'output'``, the authors' later code); a
       FOO client sends c. :meth:`receive`: the server writes c into its table of the latest
       embedding of every (sample, client); :meth:`refresh_stale` has every entry of B older
       than ``max_staleness`` iterations re-sent by its client (bounded delay, the paper's
       Assumption); the server reads the other clients' entries of B from the table.
    2. :meth:`answer_queries`: the server answers a ZOO query with the batch-mean losses h and
       h_hat_k, computed in float64 from the SAME head parameters, before its own update.
    3. :meth:`update_server`: one step on the head (backprop, sending a FOO client dL/dc; or its
       own two-point estimate on the head parameters for ZOO); the client steps
       (:meth:`Parties.answer_client`) with (phi(d)/mu) mean_k (h_hat_k - h) u_k (eq. 3),
       back-propagated locally through its model when ``zoo_space='output'``, or with dL/dc.

    Where the parties run decides the order of a batch's iterations: all the batch's clients
    are asked at once and each message is one server iteration as it arrives. Local parties
    answer in the order the speed model draws (:meth:`ClientActivation.next_pass`); Ray actors
    compute concurrently and answer in the order they really finish (``runtime=ray``, see
    docs/runtime.md).

    Epochs (``epoch``): ``'client_pass'`` (default) has every client process every batch once,
    in the order the clients finish (:meth:`ClientActivation.next_pass`), so an epoch is M·N/B
    server iterations, as the paper's and the authors' epochs; ``'server_iterations'`` draws one
    client per batch, so an epoch is N/B iterations and each client sees 1/M of the data.

    Wire: a ZOO client's uplink is 1 + q embeddings in float64 (64 bits per element: a float32
    c_hat - c at mu = 0.001 is mostly rounding), its downlink 1 + q float64 loss scalars and never a
    gradient. ``global_step`` and ``comm/rounds`` count server iterations: one per received
    message (query) when asynchronous, one per batch when synchronous. The initial pass that
    fills the table is sent over the wire too (kind ``initial_embedding``), and so are refreshed
    entries (kind ``refreshed_embedding``, counted in ``async/refreshes``).
    """

    RUNTIMES = ("local", "ray", "grpc")
    PARTY_CALLS = "async"
    PARTY_SETTINGS = (
        "_target_",
        "name",
        "client_update",
        "synchronous",
        "direction",
        "mu",
        "num_directions",
        "zoo_space",
    )

    @property
    def party_answers(self) -> str:
        """Zeroth-order clients get loss values, first-order ones dL/dc."""
        return "losses" if self.client_update == "zoo" else "gradients"

    def __init__(
        self,
        parties,
        head,
        mechanism,
        optimizer,
        num_classes: int,
        *,
        client_update: str = "zoo",
        server_update: str = "foo",
        synchronous: bool = False,
        epoch: str = "client_pass",
        max_staleness: int | None = None,
        direction: str = "gaussian",
        mu: float = 0.001,
        num_directions: int = 1,
        zoo_space: str = "params",
        client_speeds: Sequence[float] | None = None,
        activation_order: Sequence[int] | None = None,
        **kwargs,
    ) -> None:
        super().__init__(parties, head, mechanism, optimizer, num_classes, **kwargs)
        for label, value in (("client_update", client_update), ("server_update", server_update)):
            if value not in UPDATES:
                raise ValueError(f"algo.{label} must be one of {UPDATES}, got {value!r}")
        if client_update == "foo" and server_update == "zoo":
            raise ValueError(
                "client_update='foo' needs server_update='foo': a zeroth-order server has no "
                "gradient to send to its clients"
            )
        check_zoo_options(mu=mu, num_directions=num_directions, direction=direction)
        if zoo_space not in ZOO_SPACES:
            raise ValueError(f"algo.zoo_space must be one of {ZOO_SPACES}, got {zoo_space!r}")
        if epoch not in EPOCHS:
            raise ValueError(f"algo.epoch must be one of {EPOCHS}, got {epoch!r}")
        if max_staleness is not None and (
            isinstance(max_staleness, bool)
            or int(max_staleness) != max_staleness
            or max_staleness < 0
        ):
            raise ValueError(
                f"algo.max_staleness must be an integer >= 0 (server iterations) or null, "
                f"got {max_staleness!r}"
            )
        if not isinstance(mechanism, Plain):
            raise ValueError(
                f"algo={self.name} sends plain embeddings: mechanism must be plain, "
                f"got {type(mechanism).__name__}"
            )
        self.client_update = client_update
        self.server_update = server_update
        self.synchronous = bool(synchronous)
        self.epoch = epoch
        self.max_staleness = None if max_staleness is None else int(max_staleness)
        self.direction = direction
        self.mu = float(mu)
        self.num_directions = int(num_directions)
        self.zoo_space = zoo_space
        self.activation = ClientActivation(
            self.num_parties, client_speeds, activation_order, seed=self.seed
        )
        permutation = activation_order is None or sorted(activation_order) == list(
            range(self.num_parties)
        )
        if self.passes and not permutation:
            raise ValueError(
                "algo.activation_order must list every client exactly once with "
                f"algo.epoch=client_pass (each batch goes through every client), got "
                f"{list(activation_order)}; use algo.epoch=server_iterations for other orders"
            )
        self.table: EmbeddingTable | None = None
        self._pending_table: dict | None = None
        self.refreshes = 0
        self.last_ages: torch.Tensor | None = None

    def transport_options(self) -> dict:
        """The parties answer the family's calls (initial pass, refreshes, messages, answers)."""
        return {"asynchronous": True}

    @property
    def passes(self) -> bool:
        """Whether each batch goes through every client in turn (asynchronous client passes)."""
        return self.epoch == "client_pass" and not self.synchronous

    # ----------------------------------------------------------------- the server's table
    def on_train_start(self) -> None:
        if self.table is not None:
            return
        if self._pending_table is not None:
            self.table = EmbeddingTable.from_state_dict(self._pending_table, self.device)
            self._pending_table = None
            return
        self.table = self.initial_pass()

    def initial_pass(self) -> EmbeddingTable:
        """Every client sends its embedding of the whole training split (no gradient)."""
        datamodule = getattr(self.trainer, "datamodule", None)
        splits = getattr(datamodule, "splits", {})
        if "train" not in splits:
            raise RuntimeError(
                f"algo={self.name} fills the server's embedding table from the datamodule's "
                "preloaded training split: fit with a VerticalDataModule"
            )
        columns = self.party_side.initial_embeddings(splits["train"].xs, chunk=INITIAL_PASS_CHUNK)
        for m, column in enumerate(columns):
            self.wire.send(UPLINK, m, column, kind="initial_embedding")
        return EmbeddingTable.from_initial_pass([column.to(self.device) for column in columns])

    # ----------------------------------------------------------------- one iteration
    def schedule(self) -> tuple[list[int], bool]:
        """The clients asked at once on the current batch, and whether all their messages make
        one server iteration (synchronous) or each message its own, as it arrives."""
        if self.synchronous:
            return list(range(self.num_parties)), True
        if self.passes:
            return self.activation.next_pass(), False
        return [self.activation.next()], False

    def query_losses(
        self,
        columns: list[torch.Tensor],
        m: int,
        query: tuple[torch.Tensor, torch.Tensor],
        y: torch.Tensor,
        head_parameters: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        """The server's answer [h, h_hat_1..h_hat_q] to client m's query (c, c_hat): batch-mean
        losses in float64, client m's column replaced by c, then by each c_hat_k, all with the
        same head parameters."""
        embedding, perturbed = query
        candidates = torch.cat([embedding[None], perturbed])
        inputs = [
            candidates if j == m else column.double().expand(len(candidates), *column.shape)
            for j, column in enumerate(columns)
        ]
        with torch.no_grad():
            logits = evaluate_at(self.head, head_parameters, self.mechanism.fuse(inputs))
        return batch_losses(logits, y)

    def zoo_server_gradient(self, columns, y, generator):
        """The server's own two-point estimate on its head parameters (zoo_vfl); sets .grad.

        Both losses use the clients' unperturbed embeddings. Appendix B (line 9) evaluates the
        perturbed head on the clients' c_hat instead: unbiased too, but the clients'
        perturbations add variance to the server's estimate.
        """
        fused = self.mechanism.fuse([column.double() for column in columns])
        w0 = flat_parameters(self.head)
        u = sample_directions(
            self.num_directions, w0.shape, direction=self.direction, generator=generator
        )
        with torch.no_grad():
            logits = perturbed_outputs(self.head, torch.cat([w0[None], w0 + self.mu * u]), fused)
            losses = batch_losses(logits, y)
        loss, perturbed = losses[0], losses[1:]
        set_gradient(
            self.head,
            two_point_estimate(loss, perturbed, u, mu=self.mu, direction=self.direction),
        )
        return loss.float(), logits[0].float()

    def protocol_step(self, xs: Sequence[torch.Tensor], y: torch.Tensor, idx: torch.Tensor):
        """Every server iteration of one batch; returns (mean loss, logits of the last one).

        The schedule's clients are asked for their messages at once
        (:meth:`Parties.client_messages`); with one client per iteration each message that
        arrives is one server iteration. ``last_ages`` holds the table ages the server used: the
        (B, M) ages of each iteration, concatenated along the rows.
        """
        if self.table is None:
            raise RuntimeError("the embedding table is filled at train start: call trainer.fit")
        losses, ages = [], []
        clients, together = self.schedule()
        messages = self.party_side.client_messages(clients, xs, idx, zoo=self.zoo_settings)
        for arrived in [list(messages)] if together else ([m] for m in messages):
            iteration = int(self.global_step)
            loss, logits = self.server_iteration(arrived, xs, y, idx)
            losses.append(loss.detach())
            ages.append(self.table.ages(idx, iteration))
        self.last_ages = torch.cat(ages)
        return torch.stack(losses).mean(), logits

    @property
    def zoo_settings(self) -> ZooSettings | None:
        """What a ZOO client's query asks for (None: first-order clients)."""
        if self.client_update != "zoo":
            return None
        return ZooSettings(self.num_directions, self.mu, self.direction, self.zoo_space)

    def server_iteration(self, arrived, xs, y, idx):
        """Algorithm 1, one iteration with the clients whose messages ``arrived`` (client, c,
        c_hat); returns (loss, logits)."""
        iteration = int(self.global_step)
        queries = self.receive(arrived, idx, iteration)
        self.refresh_stale(xs, idx, iteration)
        columns = self.table.read(idx)
        received = self.answer_queries(queries, columns, y)
        loss, logits = self.update_server(columns, [m for m, _, _ in arrived], received, y)
        with self.answering_parties(loss):
            for m, _, _ in arrived:
                self.party_side.answer_client(m, received[m])
        self.wire.end_round()
        return loss, logits

    def receive(self, arrived, idx, iteration) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Step 1, server side: each message crosses the wire (a ZOO client's c and c_hat in
        float64, a FOO client's c) and its c is written into the table. Returns the queries."""
        queries: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for m, embedding, perturbed in arrived:
            embedding = self.wire.send(UPLINK, m, embedding, kind="embedding")
            if perturbed is not None:
                for row in perturbed:
                    self.wire.send(UPLINK, m, row, kind="perturbed_embedding")
                queries[m] = (embedding, perturbed)
            self.table.write(idx, m, embedding, iteration)
        return queries

    def refresh_stale(self, xs, idx, iteration: int) -> None:
        """Bounded delay: every entry of the batch older than ``max_staleness`` iterations is
        recomputed by its client and sent again (no update), before the server reads it."""
        if self.max_staleness is None:
            return
        stale = self.table.ages(idx, iteration) > self.max_staleness
        for m in range(self.num_parties):
            rows = stale[:, m].nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            fresh = self.party_side.embed_rows(m, xs[m][rows] if xs else None, idx[rows])
            sent = self.wire.send(UPLINK, m, fresh, kind="refreshed_embedding")
            self.table.write(idx[rows], m, sent, iteration)
            self.refreshes += int(rows.numel())

    def answer_queries(self, queries, columns, y) -> dict[int, torch.Tensor]:
        """Step 2: [h, h_hat_1..h_hat_q] for each ZOO query, from the head before its update."""
        received: dict[int, torch.Tensor] = {}
        if queries:
            head_parameters = evaluation_parameters(self.head)
            for m, query in queries.items():
                losses = self.query_losses(columns, m, query, y, head_parameters)
                received[m] = self.wire.send(
                    DOWNLINK, m, losses, bits_per_element=LOSS_BITS, kind="loss"
                )
        return received

    def update_server(self, columns, active, received, y):
        """Step 3, server: backprop on the head (dL/dc to each FOO client in ``active``) or its own
        ZOO estimate; the server optimizer steps. Returns (loss, logits). The clients step with
        what they received (:meth:`Parties.answer_client`)."""
        server_opt = self.server_optimizer()
        self.zero_server(server_opt)
        first_order = [m for m in active if m not in received]
        if self.server_update == "foo":
            inputs = list(columns)
            for m in first_order:
                inputs[m] = inputs[m].requires_grad_()
            logits = self.head(self.mechanism.fuse(inputs))
            loss = self.loss_fn(logits, y)
            self.server_backward(loss)
            for m in first_order:
                received[m] = self.wire.send(DOWNLINK, m, inputs[m].grad, kind="gradient")
        else:
            loss, logits = self.zoo_server_gradient(columns, y, self.generator("train"))
        self.step_server(server_opt)
        return loss, logits

    def training_step(self, batch, batch_idx):
        xs, y, idx = batch
        loss, logits = self.protocol_step(xs, y, idx)
        self.log_train_step(loss, logits, y)
        ages = self.last_ages.float()
        self.accumulate_epoch("async/staleness_mean", ages.mean(), int(y.shape[0]))
        self.accumulate_epoch("async/staleness_max", ages.max(), reduce="max")
        if self.max_staleness is not None:
            self.accumulate_epoch("async/refreshes", float(self.refreshes), reduce="max")
        return loss

    def results(self) -> dict:
        return super().results() | {"async/refreshes": self.refreshes}

    # ----------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["async"] = {
            "activation": self.activation.state_dict(),
            "table": None if self.table is None else self.table.state_dict(),
            "refreshes": self.refreshes,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        super().on_load_checkpoint(checkpoint)
        state = checkpoint.get("async")
        if state is None:
            raise ValueError(
                f"checkpoint has no 'async' state: it was not written by algo={self.name}"
            )
        self.activation.load_state_dict(state["activation"])
        self.refreshes = int(state["refreshes"])
        self.table = None
        self._pending_table = state["table"]
