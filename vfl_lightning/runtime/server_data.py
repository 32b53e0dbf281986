"""The server's part of the data under ``runtime=ray``, made in a Ray task (another process): the
dataset is read there, and only sample ids, labels, shapes and the parties' widths come back."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import ray
import torch

from vfl_lightning.algorithms.party_factory import PartyFactory


@dataclass
class ServerSetup:
    """What the server process gets: its data module (labels and ids, and the label holder's own
    slice when it holds features: no party column), each party's embedding width, and the global
    generators' states after the party models were built (so the head it builds next starts
    exactly as the local runtime's)."""

    datamodule: object
    widths: list[int]
    generator_states: tuple


def strip_party_columns(datamodule) -> None:
    """Drop every party's columns from every split of ``datamodule`` (and the rows the parties
    hold before alignment): a split keeps its labels and, with ``data.active_party=true``, the
    label holder's own (last) slice."""
    own = datamodule.server_shape is not None
    for split in datamodule.splits.values():
        split.xs = split.xs[-1:] if own else []
    datamodule.party_tables = []


def restore_generators(states: tuple) -> None:
    torch_state, numpy_state, python_state = states
    torch.set_rng_state(torch_state)
    np.random.set_state(numpy_state)
    random.setstate(python_state)


def label_holder_setup(factory: PartyFactory, num_threads: int) -> ServerSetup:
    """Build, as the local run does (the run's seed, the data module, every party model in
    order), then keep only what the server may hold. Party files: only the server's file is read.
    Rows that await the PSI stay unaligned: the runtime aligns them with the party actors."""
    import lightning as L

    torch.set_num_threads(num_threads)
    L.seed_everything(factory.seed, workers=True, verbose=False)
    if factory.reads_party_files:
        datamodule = factory.datamodule(party_columns=False)
    else:
        datamodule = factory.datamodule(defer_alignment=True)
        strip_party_columns(datamodule)
    widths = [int(model.embedding_dim) for model in factory.party_models(datamodule.party_shapes)]
    states = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    return ServerSetup(datamodule, widths, states)


def server_setup(factory: PartyFactory) -> ServerSetup:
    """:func:`label_holder_setup` run as a Ray task; the global generators of this process are
    left as the local runtime's build leaves them."""
    task = ray.remote(label_holder_setup).options(num_cpus=0, max_retries=0)
    setup = ray.get(task.remote(factory, torch.get_num_threads()))
    restore_generators(setup.generator_states)
    return setup
