"""Shared fixtures: compose the Hydra config in-process (CPU, no logger, quiet)."""

from __future__ import annotations

import functools
import os
import signal
import sys
import time
from pathlib import Path

import hydra
import lightning as L
import pytest
import torch
from absl import logging as absl_logging
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
os.environ.setdefault("WANDB_MODE", "disabled")
# The test models are tiny: one intra-op thread is faster than two and does not oversubscribe the
# 2-core CI machine; subprocesses (CLI, multirun tests) inherit it through the environment.
os.environ.setdefault("OMP_NUM_THREADS", "1")
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# absl (imported by dp_accounting) keeps a logging handler on the stderr of its import time, and
# closes that stream when logging shuts every handler down, as Hydra's per-job logging config does:
# under pytest's capture that stream is pytest's own capture file. The real stderr it never closes.
absl_logging.get_absl_handler().python_handler.stream = sys.__stderr__

QUIET = [
    "logger=none",
    "trainer.accelerator=cpu",
    "trainer.enable_progress_bar=false",
    "trainer.num_sanity_val_steps=0",
]


def compose_config(output_dir: Path, *overrides: str) -> DictConfig:
    """The config ``python train.py <overrides>`` would run, writing into ``output_dir``."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(version_base="1.3", config_dir=CONF_DIR):
        cfg = compose("train", overrides=[*QUIET, *overrides], return_hydra_config=True)
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        cfg.paths.output_dir = str(output_dir)
        del cfg["hydra"]
    GlobalHydra.instance().clear()
    return cfg


@functools.cache
def algo_report_config(algo: str) -> dict:
    """``{"report": ...}``: how the report draws ``algo``, as its composed config holds it."""
    from omegaconf import OmegaConf

    cfg = compose_config(Path("unused"), f"algo={algo}")
    return {"report": OmegaConf.to_container(cfg.report)}


def run_train_py(argv: list[str]) -> None:
    """``python train.py <argv>`` in this process: the root train.py's task function under
    ``hydra.main`` (add ``-m`` to the argv for a multirun)."""
    from vfl_lightning.cli import main as cli_main

    main = hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="train")(cli_main)
    GlobalHydra.instance().clear()
    saved = sys.argv
    sys.argv = ["train.py", *argv]
    try:
        main()
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()


class StopAt(L.Callback):
    """Stops a run before batch ``batch`` of epoch ``epoch``: ``how`` = ``error`` (an exception),
    ``interrupt`` (Ctrl-C), ``sigterm`` (SIGTERM to this process), ``kill`` (SIGKILL to this
    process: kill -9, no cleanup at all) or ``poison`` (a NaN head weight, so training itself must
    notice and stop); with ``job``, only in that job of a multirun (``hydra.job.num``).
    Used as ``+callbacks.stop._target_=conftest.StopAt`` (subprocesses add tests/ to the path)."""

    def __init__(self, epoch: int, batch: int, how: str = "error", job: int | None = None) -> None:
        self.epoch, self.batch, self.how, self.job = epoch, batch, how, job

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) != (self.epoch, self.batch):
            return
        if self.job is not None and HydraConfig.get().job.num != self.job:
            return
        if self.how == "kill":
            # the kill lands after the last checkpoint reached disk, as the tests that use it
            # assume (a kill during a write is its own test: test_checkpoints' kill-in-rename);
            # on a loaded machine the background write could otherwise still be in flight
            wait = getattr(trainer.strategy.checkpoint_io, "wait", None)
            if wait is not None:
                wait()
            os.kill(os.getpid(), signal.SIGKILL)
        if self.how == "interrupt":
            raise KeyboardInterrupt
        if self.how == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if self.how == "poison":  # the run goes on with a NaN weight: its next loss is NaN
            with torch.no_grad():
                next(pl_module.head.parameters()).view(-1)[0] = float("nan")
            return
        raise RuntimeError(f"simulated crash at epoch {self.epoch}, batch {self.batch}")


class WritePid(L.Callback):
    """Writes this process's id to ``<run output dir>/pid`` when fitting starts (which process
    ran a multirun job). Used as ``+callbacks.pid._target_=conftest.WritePid``."""

    def on_fit_start(self, trainer, pl_module) -> None:
        Path(HydraConfig.get().runtime.output_dir, "pid").write_text(str(os.getpid()))


def stop_at(epoch: int, batch: int, how: str = "error", job: int | None = None) -> list[str]:
    """The overrides that add :class:`StopAt` to a run (to job ``job`` of a multirun only)."""
    return [
        "+callbacks.stop._target_=conftest.StopAt",
        f"+callbacks.stop.epoch={epoch}",
        f"+callbacks.stop.batch={batch}",
        f"+callbacks.stop.how={how}",
        *([f"+callbacks.stop.job={job}"] if job is not None else []),
    ]


def assert_same_training_state(a: dict, b: dict) -> None:
    """Two checkpoints hold bit-identical parameters and wire state (ledger, clock)."""
    assert a["state_dict"].keys() == b["state_dict"].keys()
    for key, value in a["state_dict"].items():
        assert torch.equal(value, b["state_dict"][key]), key
    assert a["vfl"]["wire"] == b["vfl"]["wire"]


@pytest.fixture
def make_cfg(tmp_path):
    """``make_cfg(*overrides)`` -> a composed config writing under a fresh tmp dir."""
    counter = iter(range(1000))

    def _make(*overrides: str) -> DictConfig:
        return compose_config(tmp_path / f"run{next(counter)}", *overrides)

    return _make


def fit(cfg: DictConfig):
    """Build from ``cfg`` and fit with a plain Trainer; return (trainer, module, datamodule)."""
    import lightning as L
    from hydra.utils import instantiate

    from vfl_lightning.train import build

    L.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[])
    trainer.fit(module, datamodule=datamodule)
    return trainer, module, datamodule


def resume_against_straight(make_cfg, common, *, epochs: int, first: int):
    """Train ``epochs`` epochs straight, and ``first`` epochs then resume to ``epochs``.

    Returns (straight checkpoint, resumed checkpoint, resumed results), having asserted that the
    two runs end with bit-identical parameters and wire state (ledger, clock).
    """
    from vfl_lightning.train import train

    def last(cfg):
        return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"

    straight = make_cfg(*common, f"trainer.max_epochs={epochs}")
    train(straight)
    head = make_cfg(*common, f"trainer.max_epochs={first}")
    train(head)
    resumed = make_cfg(*common, f"trainer.max_epochs={epochs}", f"ckpt_path={last(head)}")
    results = train(resumed)
    a = torch.load(last(straight), weights_only=False)
    b = torch.load(last(resumed), weights_only=False)
    assert_same_training_state(a, b)
    return a, b, results


# ----------------------------------------------------------------- runtime=ray
@pytest.fixture(scope="session")
def ray_session(tmp_path_factory):
    """One local Ray instance with 2 CPUs for every Ray test of the session (train() joins it
    rather than starting its own); shut down at the end. The parties' machine-named root
    (``runtime.party_dir=null``) is a folder of the session's, set before Ray starts so every
    actor process inherits it."""
    from vfl_lightning.runtime.party_state import PARTY_DIR_ENV

    ray = pytest.importorskip("ray")
    os.environ[PARTY_DIR_ENV] = str(tmp_path_factory.mktemp("party_machines"))
    start_ray(ray)
    yield
    ray.shutdown()


def start_ray(ray, attempts: int = 3) -> None:
    """``ray.init`` for the tests, tried again when the local instance does not come up (on a
    loaded machine Ray's GCS can miss its startup deadline: "Timed out waiting for file
    .../gcs_server_port_..."), so one slow start does not fail every Ray test at setup."""
    for attempt in range(1, attempts + 1):
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            return
        except Exception:
            ray.shutdown()
            if attempt == attempts:
                raise
            time.sleep(5 * attempt)


RAY_TWO_PARTIES = [
    "data.num_parties=2",
    "data.partition=halves",
    "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1",
]
"""Small runs for the Ray tests: two parties (two actors), one validation and test batch."""


def last_checkpoint(cfg: DictConfig) -> Path:
    return Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


def checkpoint_wire(cfg: DictConfig) -> dict:
    """The last checkpoint's ledger (bits per party and direction, rounds) and simulated clock,
    without the serialized bytes (which only runtime=ray counts)."""
    state = torch.load(last_checkpoint(cfg), weights_only=False)["vfl"]["wire"]
    state["ledger"].pop("serialized_bytes")
    return state


class KillParty(L.Callback):
    """Kills party ``party``'s actor before batch ``batch`` of epoch ``epoch`` (added to a run as
    ``+callbacks.kill._target_=conftest.KillParty``: pytest puts tests/ on the path), and waits
    until the actor is dead, so the batch's round is the one that finds it dead (``ray.kill``
    returns before the actor stops: on a loaded machine a round could still reach it)."""

    def __init__(self, epoch: int, batch: int, party: int) -> None:
        self.epoch, self.batch, self.party = epoch, batch, party

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if (trainer.current_epoch, batch_idx) == (self.epoch, self.batch):
            import ray
            from ray.exceptions import GetTimeoutError, RayActorError

            def alive(actor) -> bool:  # a local function: Ray ships it by value
                return True

            actor = pl_module.party_side.actors[self.party]
            ray.kill(actor)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                try:
                    ray.get(actor.__ray_call__.remote(alive), timeout=30)
                except RayActorError:
                    return
                except GetTimeoutError:
                    continue
                time.sleep(0.05)
            raise AssertionError(f"party {self.party}'s actor still answers after ray.kill")


def kill_party(make_cfg, common, *, epoch: int, batch: int, party: int) -> tuple[DictConfig, str]:
    """Run ``common`` with party ``party``'s actor killed before (``epoch``, ``batch``); check the
    run stops with one line and records it in results.json as failed. Returns (config, line)."""
    import json

    from vfl_lightning.errors import PartyLost
    from vfl_lightning.train import train

    kill = ["_target_=conftest.KillParty", f"epoch={epoch}", f"batch={batch}", f"party={party}"]
    killed = make_cfg(*common, *[f"+callbacks.kill.{k}" for k in kill])
    with pytest.raises(PartyLost) as error:
        train(killed)
    message = str(error.value)
    assert "\n" not in message
    results = json.loads((Path(killed.paths.output_dir) / "results.json").read_text())
    assert results["status"] == "failed" and results["error"] == message
    return killed, message


# ----------------------------------------------------------------- what Ray parties hold
# The tests' view of the parties (an observer's, not the server's protocol calls: no actor method
# returns a party's state, so the observer runs its own code in the actor through Ray's
# ``__ray_call__``, which the driver of a Ray cluster can always do; docs/threat_model.md).
def actor_states(party_side) -> list[dict]:
    """Every Ray party actor's state (model, optimizer, generators), read from the actors once
    they ran the calls the server sent them (an update waits for the next exchange)."""
    import ray

    party_side.settle()

    def capture(actor) -> dict:  # a local function: Ray ships it by value, not as conftest's
        return actor.own.state_dict()

    return ray.get([actor.__ray_call__.remote(capture) for actor in party_side.actors])


def load_actor_states(party_side, states: list[dict]) -> None:
    import ray

    party_side.settle()

    def restore(actor, state: dict) -> None:  # the observer's powers, not the party's resume
        actor.own.model.load_state_dict(state["model"])
        actor.own.optimizer.load_state_dict(state["optimizer"])
        actor.own.generators.load_state_dict(state["generators"])

    actors = zip(party_side.actors, states, strict=True)
    ray.get([actor.__ray_call__.remote(restore, state) for actor, state in actors])


def actor_parameters(party_side) -> list[tuple[str, torch.Tensor]]:
    """Every Ray party's model tensors as (``parties.<m>.<name>``, tensor), party by party."""
    return [
        (f"parties.{m}.{name}", tensor)
        for m, state in enumerate(actor_states(party_side))
        for name, tensor in state["model"].items()
    ]


def ray_party_dir(cfg: DictConfig) -> Path:
    """Where the Ray parties of a run keep their directories (``runtime.party_dir``, or the root
    their machine names: this process's environment is theirs)."""
    from vfl_lightning.run.ray_session import party_trust

    return party_trust(cfg).root()


def saved_party_states(party_dir: Path, checkpoint: dict, num_parties: int) -> list[dict]:
    """The states the Ray parties saved in their own directories (under ``party_dir``) for a
    server checkpoint."""
    from vfl_lightning.runtime.party_state import load_party_state

    kept = checkpoint["vfl"]["parties"]
    states = [
        load_party_state(party_dir, m, kept["run"], kept["round"]) for m in range(num_parties)
    ]
    assert all(state is not None for state, _ in states), states
    return [state for state, _ in states]
