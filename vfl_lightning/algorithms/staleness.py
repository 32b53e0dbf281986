"""Asynchrony (plain torch): which client is active at each iteration (client-speed model) and
the server's table of the latest embedding per (sample, client) with its age in iterations."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vfl_lightning.seeding import seeded_generator


class ClientActivation:
    """The activation sequence m_0, m_1, ... of asynchronous VFL (paper §III-C).

    With ``speeds`` s_m each client finishes its work after an exponential time of rate s_m, so
    the next message comes from client m with probability s_m / sum(s) (equal speeds by
    default): :meth:`next`. When every client must process the same batch once (an epoch of
    client passes), :meth:`next_pass` orders the M clients by such exponential finishing times.
    ``order`` replaces the draws by a fixed sequence, repeated. Draws come from a CPU generator
    seeded with ``seed`` (no device synchronization); its state is checkpointed.
    """

    def __init__(
        self,
        num_clients: int,
        speeds: Sequence[float] | None = None,
        order: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        self.num_clients = int(num_clients)
        speeds = [1.0] * self.num_clients if speeds is None else [float(s) for s in speeds]
        if len(speeds) != self.num_clients:
            raise ValueError(
                f"client_speeds needs one speed per client ({self.num_clients} clients), "
                f"got {len(speeds)} values: {speeds}"
            )
        if any(not s > 0 for s in speeds):
            raise ValueError(f"client_speeds must all be > 0, got {speeds}")
        if order is not None:
            order = [int(m) for m in order]
            if not order or any(not 0 <= m < self.num_clients for m in order):
                raise ValueError(
                    f"activation_order must be a non-empty list of client indices in "
                    f"[0, {self.num_clients - 1}], got {order}"
                )
        self.speeds = speeds
        self.order = order
        self.probabilities = torch.tensor(speeds, dtype=torch.float64) / sum(speeds)
        self._rates = torch.tensor(speeds, dtype=torch.float64)
        self.generator = seeded_generator(seed, "server", "activation")
        self.position = 0

    def next(self) -> int:
        """The client active at the next iteration."""
        if self.order is not None:
            client = self.order[self.position % len(self.order)]
        else:
            client = int(torch.multinomial(self.probabilities, 1, generator=self.generator))
        self.position += 1
        return client

    def next_pass(self) -> list[int]:
        """Every client once, in the order they finish: argsort of Exp(s_m) times, or the next
        M entries of ``order``."""
        if self.order is not None:
            clients = [
                self.order[(self.position + k) % len(self.order)] for k in range(self.num_clients)
            ]
        else:
            uniform = torch.rand(self.num_clients, generator=self.generator, dtype=torch.float64)
            finish = -torch.log1p(-uniform) / self._rates
            clients = torch.argsort(finish).tolist()
        self.position += self.num_clients
        return clients

    def state_dict(self) -> dict:
        return {"generator": self.generator.get_state(), "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.generator.set_state(state["generator"])
        self.position = int(state["position"])


class EmbeddingTable:
    """The server's latest embedding c_{i,m} of every training sample i and client m, and the
    iteration at which it was written (ages tau_{i,m} = t - written_at, paper §III-C).

    Tensors live on the module's device; reads and writes are index operations on whole
    batches (no per-sample Python work). Columns of one shape and dtype are held as one
    (num_samples, num_clients, ...) tensor, ``columns`` being its views, so a read of every
    client's entries is one index operation.
    """

    def __init__(self, columns: Sequence[torch.Tensor], written_at: torch.Tensor) -> None:
        if written_at.shape != (len(columns[0]), len(columns)):
            raise ValueError(
                f"written_at must have shape (num_samples, num_clients) = "
                f"{(len(columns[0]), len(columns))}, got {tuple(written_at.shape)}"
            )
        self.stacked: torch.Tensor | None = None
        if len({(c.shape, c.dtype, c.device) for c in columns}) == 1:
            self.stacked = torch.stack(list(columns), dim=1)
            columns = self.stacked.unbind(1)
        self.columns = list(columns)
        self.written_at = written_at

    @classmethod
    def from_initial_pass(cls, columns: Sequence[torch.Tensor]) -> EmbeddingTable:
        """A table filled by the initial pass over the training set (written at iteration 0)."""
        written_at = torch.zeros(
            len(columns[0]), len(columns), dtype=torch.long, device=columns[0].device
        )
        return cls(columns, written_at)

    @property
    def num_samples(self) -> int:
        return len(self.written_at)

    def write(
        self, idx: torch.Tensor, client: int, embedding: torch.Tensor, iteration: int
    ) -> None:
        self.columns[client][idx] = embedding.detach().to(self.columns[client].dtype)
        self.written_at[idx, client] = iteration

    def read(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Every client's latest embedding of the samples ``idx``."""
        if self.stacked is not None:
            return list(self.stacked[idx].unbind(1))
        return [column[idx] for column in self.columns]

    def ages(self, idx: torch.Tensor, iteration: int) -> torch.Tensor:
        """tau_{i,m}: iterations since each entry of rows ``idx`` was written, shape (B, M)."""
        return iteration - self.written_at[idx]

    def state_dict(self) -> dict:
        return {"columns": [c.cpu() for c in self.columns], "written_at": self.written_at.cpu()}

    @classmethod
    def from_state_dict(cls, state: dict, device: torch.device) -> EmbeddingTable:
        return cls([c.to(device) for c in state["columns"]], state["written_at"].to(device))
