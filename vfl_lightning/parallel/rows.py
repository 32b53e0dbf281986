"""Rows of a global batch split across data-parallel ranks: each rank's share, the all-gather that
joins the shares (autograd-aware), and the gradient reductions that keep every rank on one model.

Plain torch.distributed; nothing here imports Lightning.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist


def share_bounds(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """[start, stop) of ``rank``'s contiguous share of ``rows`` rows split ``world_size`` ways.

    Shares differ by at most one row, the first ``rows % world_size`` ranks taking the extra one
    (``torch.tensor_split``'s rule); a share may be empty when ``rows < world_size``.
    """
    base, extra = divmod(rows, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (rank < extra)


class RowShares:
    """One rank's view of a data-parallel federation of ``world_size`` ranks.

    Every rank reads the same global batch (the one-process data order); the parties embed only
    this rank's rows (:meth:`take`), :meth:`gather` joins the embeddings of every rank back into the
    global batch, and everything after it (wire, mechanism, server head, ledger, accountant) runs
    on the global batch, identically on every rank. The backward of :meth:`gather` hands each rank
    the gradient of its own rows only, so after a party backward each rank holds a partial sum of
    the global gradient; :meth:`sum_gradients` completes it. With one rank everything is identity.
    ``group`` is the process group (``None``: the default world group).
    """

    def __init__(self, world_size: int = 1, rank: int = 0, group=None) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.group = group

    @property
    def parallel(self) -> bool:
        return self.world_size > 1

    def bounds(self, rows: int) -> tuple[int, int]:
        return share_bounds(rows, self.world_size, self.rank)

    def take(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """This rank's rows of each (global batch) tensor."""
        if not self.parallel:
            return list(tensors)
        start, stop = self.bounds(int(tensors[0].shape[0]))
        return [t[start:stop] for t in tensors]

    def gather(self, shares: Sequence[torch.Tensor], rows: int) -> list[torch.Tensor]:
        """The global-batch tensors (``rows`` rows each) whose rows this rank holds ``shares`` of."""
        if not self.parallel:
            return list(shares)
        return list(_GatherShares.apply(self, rows, *shares))

    def gather_values(self, shares: Sequence[torch.Tensor], rows: int) -> list[torch.Tensor]:
        """:meth:`gather` without autograd: one all-gather of every share, padded to equal size."""
        local = int(shares[0].shape[0])
        widths = [math.prod(s.shape[1:]) for s in shares]
        dtype = functools.reduce(torch.promote_types, (s.dtype for s in shares))
        flat = torch.cat(
            [s.reshape(local, w).to(dtype) for s, w in zip(shares, widths, strict=True)], dim=1
        )
        capacity = -(-rows // self.world_size)
        padded = flat.new_zeros((capacity, flat.shape[1]))
        padded[:local] = flat
        gathered = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(gathered, padded.contiguous(), group=self.group)
        bounds = [share_bounds(rows, self.world_size, r) for r in range(self.world_size)]
        joined = torch.cat(
            [g[: stop - start] for g, (start, stop) in zip(gathered, bounds, strict=True)]
        )
        columns = torch.split(joined, widths, dim=1)
        return [
            c.reshape(rows, *s.shape[1:]).to(s.dtype) for c, s in zip(columns, shares, strict=True)
        ]

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Sum every parameter's ``.grad`` over the ranks (one all-reduce of a flat buffer).

        A sum, not a mean: each rank's gradient is already its rows' part of the global batch's
        mean loss, so the sum is exactly the one-process gradient (up to summation order).
        """
        grads = self._grads(parameters)
        if not grads:
            return
        flat = _flatten(grads)
        dist.all_reduce(flat, group=self.group)
        _unflatten(flat, grads)

    def broadcast_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Give every rank rank 0's ``.grad`` (the replicated server's): bit-identical replicas even
        where a kernel is not deterministic across processes."""
        grads = self._grads(parameters)
        if not grads:
            return
        flat = _flatten(grads)
        dist.broadcast(flat, group=self.group, group_src=0)
        _unflatten(flat, grads)

    def _grads(self, parameters: Iterable[torch.nn.Parameter]) -> list[torch.Tensor]:
        if not self.parallel:
            return []
        return [p.grad for p in parameters if p.grad is not None]


def _flatten(grads: list[torch.Tensor]) -> torch.Tensor:
    dtype = functools.reduce(torch.promote_types, (g.dtype for g in grads))
    return torch.cat([g.reshape(-1).to(dtype) for g in grads])


def _unflatten(flat: torch.Tensor, grads: list[torch.Tensor]) -> None:
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


class _GatherShares(torch.autograd.Function):
    """All-gather of row shares whose backward keeps this rank's rows of the incoming gradient.

    Every rank computes the same global loss from the gathered tensors, so the gradient of rank r's
    rows is the rows [start, stop) of the global gradient on rank r itself: no communication.
    """

    @staticmethod
    def forward(ctx, shares: RowShares, rows: int, *tensors: torch.Tensor):
        ctx.bounds = shares.bounds(rows)
        return tuple(shares.gather_values(tensors, rows))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        start, stop = ctx.bounds
        return (None, None, *(None if g is None else g[start:stop] for g in grads))
