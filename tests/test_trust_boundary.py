"""The trust boundary of runtime=ray, read from the server process as a curious server would: no
party's feature column in its data module, its batches or its checkpoint; party state on the party."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import RAY_TWO_PARTIES as TWO_PARTIES
from conftest import last_checkpoint, ray_party_dir
from lightning import Callback

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.data.datamodule import VerticalDataModule
from vfl_lightning.data.export import CONF_DIR, export
from vfl_lightning.data.party_files import party_file_name
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.identity import IDENTITY_FILE
from vfl_lightning.runtime.party_state import load_party_state, party_state_path, save_party_state
from vfl_lightning.runtime.party_trust import KNOWN_PARTIES_FILE
from vfl_lightning.train import check_runtime, train

RAY_DERIVED = ("runtime=ray", "runtime.party_seeds=derived")
"""runtime=ray with the seed-derived party streams of runtime=local: digests comparable."""

SMALL = [*TWO_PARTIES, "trainer.max_epochs=2", "trainer.limit_train_batches=3", "seed=0"]
NOT_DATA = [o for o in SMALL if not o.startswith("data.")]
"""The small run without its data settings (for the default four quadrants, or party files)."""


class RecordServerData(Callback):
    """Keeps every batch the server's Lightning loop receives and the server's data module (class
    attributes: the run instantiates the callback from its config)."""

    batches: list = []
    datamodule = None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        RecordServerData.batches.append(batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        RecordServerData.batches.append(batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        RecordServerData.batches.append(batch)

    def on_fit_start(self, trainer, pl_module) -> None:
        RecordServerData.batches = []
        RecordServerData.datamodule = trainer.datamodule


RECORD = "+callbacks.record._target_=test_trust_boundary.RecordServerData"


def arrays_in(value, seen: set | None = None):
    """Every tensor and numpy array reachable from ``value`` through containers and the attributes
    of vfl_lightning objects (never through the trainer)."""
    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, (torch.Tensor, np.ndarray)):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from arrays_in(item, seen)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from arrays_in(item, seen)
    elif type(value).__module__.startswith("vfl_lightning"):
        for name, item in vars(value).items():
            if name not in ("trainer", "_trainer"):
                yield from arrays_in(item, seen)


def floating(array) -> bool:
    if isinstance(array, torch.Tensor):
        return array.is_floating_point()
    return np.issubdtype(array.dtype, np.floating)


def split_sizes(datamodule) -> set[int]:
    return {len(split) for split in datamodule.splits.values()}


def assert_no_party_column(datamodule, batches, checkpoint) -> None:
    """No float array in the data module (labels and ids are integers; features are floats), no
    party column in a batch, no tensor in the checkpoint with a data split's rows."""
    assert batches, "the run recorded its batches"
    for xs, y, idx in batches:
        assert xs == [] and not y.is_floating_point() and not idx.is_floating_point()
    assert not [a.shape for a in arrays_in(datamodule) if floating(a)]
    rows = split_sizes(datamodule)
    tensors = list(arrays_in(checkpoint))
    assert tensors and not [a.shape for a in tensors if a.ndim and a.shape[0] in rows]


def test_the_ray_server_holds_no_feature_column_and_trains_the_local_model(make_cfg, ray_session):
    """(a) Under runtime=ray's defaults (private party seeds) no feature column exists in the
    server process's data module, its batches or its checkpoint, and the run trains and evaluates;
    with derived party seeds the same run's model_digest is runtime=local's."""
    cfg = make_cfg("algo=pbm", *SMALL, "runtime=ray", RECORD)
    remote = train(cfg)
    checkpoint = torch.load(last_checkpoint(cfg), weights_only=False)
    assert_no_party_column(RecordServerData.datamodule, RecordServerData.batches, checkpoint)
    assert {"train", "val", "test"} <= {k.split("/")[0] for k in remote if "/acc" in k}
    assert remote["party_seeds"] == "private"
    local = train(make_cfg("algo=pbm", *SMALL, "runtime=local"))
    derived = train(make_cfg("algo=pbm", *SMALL, *RAY_DERIVED, RECORD))
    assert_no_party_column(RecordServerData.datamodule, RecordServerData.batches, checkpoint)
    assert derived["model_digest"] == local["model_digest"] != remote["model_digest"]
    assert_party_state_with_the_parties(checkpoint, ray_party_dir(cfg), num_parties=2)
    assert cfg.runtime.party_dir is None  # the default: each party's machine names its root
    assert_no_party_file_in(Path(cfg.paths.output_dir))
    assert not ray_party_dir(cfg).is_relative_to(Path(cfg.paths.output_dir).resolve())


PARTY_FILES = ("round_*.pt", IDENTITY_FILE, KNOWN_PARTIES_FILE)


def assert_no_party_file_in(run_dir: Path) -> None:
    """No party state, identity key or pinned peers anywhere in the server's run directory."""
    assert run_dir.is_dir()
    found = [str(p) for pattern in PARTY_FILES for p in run_dir.rglob(pattern)]
    assert found == []


def assert_party_state_with_the_parties(checkpoint: dict, party_dir, num_parties: int):
    """The server's checkpoint holds no party model, optimizer or generator, and no path: the
    run key and round only; each party saved its own state for them in its own directory."""
    assert not [key for key in checkpoint["state_dict"] if key.startswith("parties.")]
    parties = checkpoint["vfl"]["parties"]
    assert sorted(parties) == ["round", "run"] and parties["round"] > 0
    assert len(checkpoint["optimizer_states"]) == 1, "the head's optimizer only"
    for m in range(num_parties):
        state, problem = load_party_state(party_dir, m, parties["run"], parties["round"])
        assert problem == "" and {"generators", "model", "optimizer"} <= set(state)
        assert state["model"] and all(torch.isfinite(t).all() for t in state["model"].values())


def test_an_active_label_holder_keeps_exactly_its_own_slice(make_cfg, ray_session):
    """With data.active_party=true the server's batches carry one slice, its own (the local
    data module's last), and the run still equals the local one."""
    common = ["algo=splitnn", *NOT_DATA, "data.active_party=true"]
    local_cfg = make_cfg(*common, "runtime=local", RECORD)
    local = train(local_cfg)
    local_batches = RecordServerData.batches
    remote = train(make_cfg(*common, *RAY_DERIVED, RECORD))
    assert remote["model_digest"] == local["model_digest"]
    assert len(RecordServerData.batches) == len(local_batches)
    for (xs, y, idx), (local_xs, local_y, local_idx) in zip(
        RecordServerData.batches, local_batches, strict=True
    ):
        assert len(xs) == 1 and torch.equal(xs[0], local_xs[-1])
        assert torch.equal(y, local_y) and torch.equal(idx, local_idx)


def test_a_ray_run_from_party_files_equals_the_local_run_from_the_dataset(
    tmp_path, make_cfg, ray_session
):
    """data=party_files under Ray: the server reads its file, each actor its own; same digest."""
    files = tmp_path / "files"
    export(["data.num_parties=2", "data.partition=halves"], files, CONF_DIR)
    local = train(make_cfg("algo=pbm", *SMALL, "runtime=local"))
    from_files = ["data=party_files", f"data.dir={files}", *RAY_DERIVED, RECORD]
    remote = train(make_cfg("algo=pbm", *NOT_DATA, *from_files))
    assert remote["model_digest"] == local["model_digest"]
    assert all(xs == [] for xs, _, _ in RecordServerData.batches)


def test_a_party_reads_its_own_file_and_no_other(tmp_path, make_cfg):
    """A party's columns come from its own file alone: with every other party file gone they
    are still read, equal to the dataset's columns of that party."""
    files = tmp_path / "files"
    export(["data.num_parties=2", "data.partition=halves"], files, CONF_DIR)
    (files / party_file_name(0)).unlink()
    (files / "server.npz").unlink()
    factory = PartyFactory.from_config(make_cfg("data=party_files", f"data.dir={files}"))
    table, shapes = factory.own_columns(1)
    expected, _ = PartyFactory.from_config(make_cfg(*TWO_PARTIES)).own_columns(1)
    assert shapes[1] == tuple(expected["train"].shape[1:]) and len(shapes) == 2
    # the rows it holds, with their ids, in its own order: each row is the dataset's row
    split_index = VerticalDataModule(num_parties=2, partition="halves").split_index
    where = {int(i): (s, r) for s, rows in split_index.items() for r, i in enumerate(rows)}
    assert sorted(table.ids.tolist()) == sorted(where)
    for i, row in zip(table.ids.tolist(), table.features, strict=True):
        stage, r = where[i]
        assert torch.equal(torch.from_numpy(row), expected[stage][r])
    with pytest.raises(ValueError, match="party_0.npz is missing"):
        factory.own_columns(0)


RUN = "0123456789abcdef0123456789abcdef"


def test_a_party_state_of_another_round_or_party_is_refused(tmp_path):
    """A resume loads exactly the state saved for the checkpoint's run and round by that party."""
    state = {"model": {"weight": torch.ones(2)}, "optimizer": {}, "generators": {}}
    path = save_party_state(tmp_path, 1, RUN, 6, state)
    assert path == party_state_path(tmp_path, 1, RUN, 6)
    assert path == tmp_path / "party_1" / "runs" / RUN / "round_6.pt"
    loaded, problem = load_party_state(tmp_path, 1, RUN, 6)
    assert problem == "" and torch.equal(loaded["model"]["weight"], torch.ones(2))
    missing, problem = load_party_state(tmp_path, 1, RUN, 9)
    assert missing is None and "\n" not in problem
    assert (
        problem.startswith("party 1 has no state for training round 9") and "round_6.pt" in problem
    )
    path.rename(party_state_path(tmp_path, 1, RUN, 9))
    _, problem = load_party_state(tmp_path, 1, RUN, 9)
    assert "holds the state of party 1 at round 6, not party 1 at round 9" in problem
    party_state_path(tmp_path, 0, RUN, 9).parent.mkdir(parents=True)
    party_state_path(tmp_path, 1, RUN, 9).rename(party_state_path(tmp_path, 0, RUN, 9))
    _, problem = load_party_state(tmp_path, 0, RUN, 9)
    assert "not party 0 at round 9" in problem


@pytest.mark.parametrize("run", ["../party_1", "0123", "/etc", RUN.upper()])
def test_a_run_key_that_is_not_32_hex_digits_names_no_file(tmp_path, run):
    with pytest.raises(ValueError, match="^a run key is 32 lowercase hex digits, got "):
        load_party_state(tmp_path, 0, run, 1)


def test_a_resume_whose_party_state_is_missing_stops_in_one_line(make_cfg, ray_session):
    """The parties restore the round of the server's checkpoint or the run stops, naming it."""
    common = [
        "algo=pbm",
        *TWO_PARTIES,
        "trainer.limit_train_batches=1",
        "runtime=ray",
        "test=false",
    ]
    first = make_cfg(*common, "trainer.max_epochs=1")
    train(first)
    parties = torch.load(last_checkpoint(first), weights_only=False)["vfl"]["parties"]
    party_state_path(ray_party_dir(first), 1, parties["run"], parties["round"]).unlink()
    resumed = make_cfg(*common, "trainer.max_epochs=2", f"ckpt_path={last_checkpoint(first)}")
    with pytest.raises(ConfigError) as error:
        train(resumed)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"party 1 has no state for training round {parties['round']}")


def test_a_ray_run_with_an_empty_party_dir_is_refused_in_one_line(make_cfg):
    with pytest.raises(ConfigError) as error:
        check_runtime(make_cfg("algo=pbm", "runtime=ray", "runtime.party_dir=''"))
    assert str(error.value).startswith("runtime.party_dir must be null (each party's machine")
    assert "\n" not in str(error.value)


def test_a_party_dir_inside_the_server_run_directory_is_refused(make_cfg):
    cfg = make_cfg("algo=pbm", "runtime=ray", "runtime.party_dir=${paths.output_dir}/parties")
    with pytest.raises(ConfigError, match="^runtime.party_dir must lie outside the server's run"):
        check_runtime(cfg)


def test_a_party_dir_that_is_a_file_is_refused(make_cfg, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("")
    with pytest.raises(ConfigError, match=f"got '{taken}'"):
        check_runtime(make_cfg("algo=pbm", "runtime=ray", f"runtime.party_dir={taken}"))


def test_a_party_keeps_its_newest_three_state_files(tmp_path):
    """State files do not pile up: each save keeps the newest three rounds of that party only
    (it resumes from the newest; the two before stay for its operator)."""
    from vfl_lightning.runtime.party_state import KEPT_ROUNDS

    for round in (4, 8, 12, 16, 20):
        save_party_state(tmp_path, 0, RUN, round, {"round": round})
    save_party_state(tmp_path, 1, RUN, 4, {})
    assert KEPT_ROUNDS == 3
    assert sorted(p.name for p in (tmp_path / "party_0" / "runs" / RUN).iterdir()) == [
        "round_12.pt",
        "round_16.pt",
        "round_20.pt",
    ]
    assert [p.name for p in (tmp_path / "party_1" / "runs" / RUN).iterdir()] == ["round_4.pt"]
    assert load_party_state(tmp_path, 0, RUN, 12)[0] == {"round": 12}
