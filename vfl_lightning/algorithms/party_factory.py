"""The party side of a run built from its configuration: data module, party models, optimizer and
mechanism. Picklable (plain dicts), so ``build`` and every Ray party actor use the same factory."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
from torch import nn

from vfl_lightning.data.alignment import PartyTable
from vfl_lightning.errors import ConfigError

PARTY_GROUPS = ("seed", "data", "party", "mechanism", "optimizer")
"""The config groups the party side is built from (never the head, the labels' use, the algo)."""


FILES_FORMS = {
    "vfl_lightning.data.segments.SegmentedDataModule": (
        "vfl_lightning.data.files_datamodule.SegmentedPartyFilesDataModule"
    ),
}
"""The data module that reads ``data=party_files`` in the form a protocol's config asks for."""


def chosen_configs() -> dict:
    """Hydra's config choices of the running job (``algo``, ``mechanism``, ...), or {} outside one."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return dict(HydraConfig.get().runtime.choices)
    except ValueError:
        return {}


@dataclass
class PartyKit:
    """What one party holds: its feature slice of every split (or, while its rows await the PSI,
    ``features`` None and its ``table``: the rows it holds, ids and columns in its own order), its
    model, optimizer, mechanism, and the data's canary records (an audit's rows and coins, drawn
    from the run's seed)."""

    features: dict[str, torch.Tensor] | None
    model: nn.Module
    optimizer: torch.optim.Optimizer
    mechanism: object
    canary_records: dict = field(default_factory=dict)
    table: PartyTable | None = None


class PartyFactory:
    """Builds the party side of the run described by ``config`` (resolved plain containers of
    :data:`PARTY_GROUPS`): locally every party at once (:meth:`party_models`), in a Ray actor one
    party (:meth:`party`), by the same sequence under the run's seed, so a party's initial
    parameters are the same wherever it runs."""

    def __init__(self, config: dict) -> None:
        missing = [group for group in PARTY_GROUPS if group not in config]
        if missing:
            raise ValueError(
                f"a party factory needs the config groups {PARTY_GROUPS}, missing {missing}"
            )
        self.config = {group: config[group] for group in PARTY_GROUPS}
        self.config["data"] = partition_as_partial(self.config["data"])

    @classmethod
    def from_config(cls, cfg) -> PartyFactory:
        """The factory of a run's (OmegaConf) configuration ``cfg``."""
        from omegaconf import OmegaConf

        return cls(
            {
                group: OmegaConf.to_container(cfg[group], resolve=True)
                if OmegaConf.is_config(cfg[group])
                else cfg[group]
                for group in PARTY_GROUPS
            }
        )

    @property
    def seed(self) -> int:
        return int(self.config["seed"])

    def complete(self, group: str, **runtime):
        """Instantiate the partial config of ``group`` with the runtime sizes; an option the chosen
        class does not take (set for another choice by an algo, experiment or attack config)
        becomes one ConfigError naming it."""
        from hydra.utils import instantiate

        return self.call(group, instantiate(self.config[group]), **runtime)

    def call(self, group: str, factory, **runtime):
        """``factory`` (the instantiated partial of ``group``) completed with the runtime sizes,
        with :meth:`complete`'s error for an option the chosen class does not take."""
        try:
            return factory(**runtime)
        except TypeError as error:
            unknown = re.search(r"unexpected keyword argument '(\w+)'", str(error))
            if unknown is None:
                raise
            choices = chosen_configs()
            chosen = ", ".join(
                f"{g}={choices[g]}" for g in ("algo", "experiment", "attack") if choices.get(g)
            )
            raise ConfigError(
                f"{group}={choices.get(group, self.config[group].get('_target_'))} has no option "
                f"{group}.{unknown.group(1)}, which the chosen configs set ({chosen}): this "
                f"combination is not supported; choose another {group} or drop the option with "
                f"~{group}.{unknown.group(1)}"
            ) from error

    def datamodule(self, **options):
        """The data module of the ``data`` config; a key of the chosen data config that the
        class another config put in ``data._target_`` does not take (``data=party_files`` under
        ``algo=fedvs``) becomes one ConfigError naming both."""
        from hydra.utils import instantiate

        try:
            return instantiate(self.config["data"], **options)
        except Exception as error:
            cause = error
            while cause.__cause__ is not None and not isinstance(cause, TypeError | ConfigError):
                cause = cause.__cause__
            unknown = re.search(r"unexpected keyword argument '(\w+)'", str(cause))
            if not isinstance(cause, TypeError) or unknown is None:
                raise
            choices = chosen_configs()
            chosen = ", ".join(
                f"{g}={choices[g]}" for g in ("algo", "experiment") if choices.get(g)
            )
            target = self.config["data"].get("_target_")
            files_form = FILES_FORMS.get(target) if choices.get("data") == "party_files" else None
            fix = (
                f"read the party files in that form with data._target_={files_form}"
                if files_form
                else "this combination is not supported; choose another data or algo"
            )
            raise ConfigError(
                f"data={choices.get('data', '?')} sets data.{unknown.group(1)}, which "
                f"data._target_={target} does not take (set by "
                f"{chosen or 'the chosen configs'}): {fix}"
            ) from error

    @property
    def reads_party_files(self) -> bool:
        """Whether the data are exported party files (``data=party_files``): then every holder
        reads its own file and no process reads another's."""
        from hydra.utils import get_class

        from vfl_lightning.data.files_datamodule import PartyFilesDataModule

        return issubclass(get_class(self.config["data"]["_target_"]), PartyFilesDataModule)

    def own_columns(
        self, party: int
    ) -> tuple[dict[str, torch.Tensor] | PartyTable, list[tuple[int, ...]]]:
        """Party ``party``'s columns and every party's input shape: the rows it holds, with their
        ids, awaiting the PSI (a :class:`PartyTable`: its own party file alone with
        ``data=party_files``, or its simulated rows of the built-in data module with
        ``data.overlap`` < 1), or its columns of every split when every party holds every row in
        the label holder's order. The data module's other columns and labels are dropped before
        this returns."""
        columns, shapes, _ = self.own_data(party)
        return columns, shapes

    def own_data(self, party: int) -> tuple[dict[str, torch.Tensor] | PartyTable, list, dict]:
        """:meth:`own_columns`, and the data's canary records (none for party files or rows that
        await the PSI)."""
        if self.reads_party_files:
            from vfl_lightning.data.party_files import read_manifest, read_party_file

            manifest = read_manifest(self.config["data"]["dir"])
            shapes = list(manifest.party_shapes)
            check_party_index(party, len(shapes))
            own = read_party_file(self.config["data"]["dir"], party)
            return PartyTable(own.ids, own.features), shapes, {}
        datamodule = self.datamodule(defer_alignment=True, score_split=False)
        shapes = datamodule.party_shapes
        check_party_index(party, len(shapes))
        if datamodule.pending is not None:
            return datamodule.party_tables[party], shapes, {}
        columns = {stage: split.xs[party] for stage, split in datamodule.splits.items()}
        return columns, shapes, dict(datamodule.canary_records)

    def party_models(self, shapes) -> list[nn.Module]:
        """One party model per input shape, in party order (the config instantiated once)."""
        from hydra.utils import instantiate

        factory = instantiate(self.config["party"])
        return [self.call("party", factory, input_shape=shape) for shape in shapes]

    def optimizer(self):
        """The partial optimizer (completed with a model's parameters)."""
        from hydra.utils import instantiate

        return instantiate(self.config["optimizer"])

    def mechanism(self, num_parties: int):
        return self.complete("mechanism", num_parties=num_parties)

    def party(self, party: int, device: torch.device | str = "cpu") -> PartyKit:
        """Party ``party``'s kit on ``device``, built as the local run builds it: the run's seed,
        its own columns (:meth:`own_columns`), every party model in order (only its own is kept),
        its optimizer, the mechanism."""
        import lightning as L

        L.seed_everything(self.seed, workers=True, verbose=False)
        columns, shapes, records = self.own_data(party)
        table = columns if isinstance(columns, PartyTable) else None
        features = None if table else {stage: x.to(device) for stage, x in columns.items()}
        model = self.party_models(shapes)[party].to(device)
        optimizer = self.optimizer()(model.parameters())
        mechanism = self.mechanism(len(shapes))
        return PartyKit(features, model, optimizer, mechanism, records, table)


def partition_as_partial(data: dict) -> dict:
    """The data config with a partition node (``data.partition: {_target_: ..., options}``)
    marked ``_partial_``: Hydra then hands the data module the function with its options, which
    the data module calls with the feature shape, the party count, the seed and the rows."""
    partition = data.get("partition") if isinstance(data, dict) else None
    if isinstance(partition, dict) and "_target_" in partition:
        return {**data, "partition": {**partition, "_partial_": True}}
    return data


def check_party_index(party: int, num_parties: int) -> None:
    if not 0 <= party < num_parties:
        raise ValueError(f"party must be in [0, {num_parties - 1}], got {party}")
