"""FederationDDPStrategy (``trainer=ddp``): Lightning's DDP processes and process group without the
DistributedDataParallel wrapper, whose reducer cannot see the parties' cut-layer backward."""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities.warnings import PossibleUserWarning
from torch.utils.data import DistributedSampler

from vfl_lightning.parallel.rows import RowShares


class FederationDDPStrategy(DDPStrategy):
    """One process per device, each a replica of the whole simulated federation.

    The protocol module does the data parallelism itself (:class:`~vfl_lightning.parallel.RowShares`):
    every rank reads the same global batch, its parties embed only the rank's share of the rows,
    the shares are all-gathered, and the server, mechanism, wire, ledger, clock, accountant and
    attacks run on the global batch, identically on every rank. Party gradients are summed across
    ranks by an explicit all-reduce before the party optimizers step; the server's gradient is
    rank 0's, broadcast. So this strategy only has to (1) leave the module unwrapped: DDP's reducer
    hooks would average gradients the protocol has already reduced, and expect every parameter in
    every backward, which a split backward does not give; (2) start every rank from rank 0's
    parameters; (3) refuse Lightning's distributed sampler, which would give the ranks different
    global batches. Rank 0 alone writes checkpoints (Lightning's ``save_checkpoint``) and
    results.json (:func:`vfl_lightning.train.train`).
    """

    def __init__(self, *, start_method: str = "popen", **kwargs) -> None:
        if start_method != "popen":
            raise ValueError(
                "trainer=ddp runs the whole script once per rank (strategy.start_method=popen, "
                f"or an external launcher such as torchrun), got start_method={start_method!r}: "
                "with spawn/fork the parent process would write results.json without the wire, "
                "accountant and attack state of the workers"
            )
        super().__init__(start_method=start_method, **kwargs)

    def setup(self, trainer) -> None:
        # Every value the module logs is computed from the global batch on every rank: there is
        # nothing to reduce, so Lightning's advice to log with sync_dist=True does not apply.
        warnings.filterwarnings(
            "ignore", message=r"It is recommended to use `self\.log\(", category=PossibleUserWarning
        )
        super().setup(trainer)

    def configure_ddp(self) -> None:
        with torch.no_grad():
            for tensor in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(tensor, src=0)

    def process_dataloader(self, dataloader: object) -> object:
        if isinstance(getattr(dataloader, "sampler", None), DistributedSampler):
            raise ValueError(
                "trainer=ddp needs trainer.use_distributed_sampler=false: every rank reads the "
                "whole global batch (the one-process data order) and embeds its own share of it"
            )
        return super().process_dataloader(dataloader)


def rank_rows(trainer, *, data_parallel: bool, name: str) -> RowShares:
    """This rank's :class:`RowShares` under ``trainer=ddp`` (one rank without a DDP strategy: all
    rows); refused for any other multi-process strategy, and for a protocol that cannot split its
    batches (``data_parallel`` false; ``name``: its algo name for the message)."""
    strategy = trainer.strategy
    if trainer.world_size == 1 and not isinstance(strategy, DDPStrategy):
        return RowShares()
    if not data_parallel:
        raise ValueError(
            f"algo={name} cannot run data-parallel (trainer.devices x num_nodes = "
            f"{trainer.world_size}, strategy {type(strategy).__name__}): its protocol state is "
            "not a function of each batch's rows, so trainer=ddp cannot split it (its class declares "
            "DATA_PARALLEL = False). Use "
            "trainer.devices=1 without a DDP strategy"
        )
    if not isinstance(strategy, FederationDDPStrategy):
        raise ValueError(
            f"strategy {type(strategy).__name__} with {trainer.world_size} process(es) would "
            "not reduce the party gradients (their backward bypasses DistributedDataParallel): "
            "use trainer=ddp (vfl_lightning.parallel.FederationDDPStrategy)"
        )
    return RowShares(trainer.world_size, trainer.global_rank)
