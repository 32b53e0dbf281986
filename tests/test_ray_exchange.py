"""The synchronous family's per-batch requests under ``runtime=ray`` (one request per party and
round, as Ray tasks or on a Ray Compiled Graph): the party runs each call it carries through the
same guarded method, carries no other call, answers one call at a time whichever Ray thread
delivers it, and a run on either path is the local run."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from conftest import RAY_TWO_PARTIES
from conftest import checkpoint_wire as ledger

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.errors import PartyRefusal
from vfl_lightning.run.ray_session import party_trust
from vfl_lightning.runtime.party_actors import SyncPartyActor
from vfl_lightning.runtime.transport import array_bytes, blob_bytes, serialized_bytes
from vfl_lightning.train import train

ROWS = torch.arange(16)


def actor(make_cfg, tmp_path, algo: str = "ldp") -> SyncPartyActor:
    cfg = make_cfg(*RAY_TWO_PARTIES, f"algo={algo}", "runtime=ray", f"runtime.party_dir={tmp_path}")
    return SyncPartyActor(PartyFactory.from_config(cfg), 0, 1, party_trust(cfg))


def test_the_exchange_carries_only_the_per_batch_calls_each_through_its_guard(make_cfg, tmp_path):
    party = actor(make_cfg, tmp_path)
    party.save_state(0)
    message, nbytes = party.exchange((("send", (ROWS.numpy(), "train", 0)),))
    assert isinstance(message, np.ndarray) and message.shape == (16, 16)
    assert nbytes == serialized_bytes(message)
    for crafted in (
        (("load_state", (party.run, 0)),),  # a call of the party's, not a per-batch one
        (("__init__", ()),),
        (("own", ()),),
        ("send",),  # not (name, arguments)
        None,
    ):
        with pytest.raises(PartyRefusal, match="^party 0 refused exchange: it carries only"):
            party.exchange(crafted)
    with pytest.raises(PartyRefusal, match="^party 0 refused send: release rounds strictly"):
        party.exchange((("send", (ROWS.numpy(), "train", 0)),))  # the rollback's second release
    with pytest.raises(PartyRefusal, match="^party 0 refused load_state: it loads state only"):
        party.load_state(party.run, 0)


def test_a_party_answers_one_call_at_a_time(make_cfg, tmp_path):
    """A compiled graph's calls run on their own Ray thread beside the ordinary calls: a load
    asked while a release is being computed waits for it, then is refused (it comes after a
    release), instead of restoring the state in the middle of the release."""
    party = actor(make_cfg, tmp_path)
    party.save_state(0)
    computing, finish, waiting = threading.Event(), threading.Event(), threading.Event()
    forward = party.own.model.forward

    def slow_forward(x):
        computing.set()
        assert finish.wait(60)
        return forward(x)

    class Watched:  # the party's lock, telling the test when a second call waits on it
        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            if not self.lock.acquire(blocking=False):
                waiting.set()
                self.lock.acquire()

        def __exit__(self, *exc):
            self.lock.release()

    party.lock = Watched(party.lock)
    party.own.model.forward = slow_forward
    release = threading.Thread(
        target=party.exchange, args=((("send", (ROWS.numpy(), "train", 0)),),)
    )
    release.start()
    assert computing.wait(60)
    outcome: list = []

    def load():
        try:
            outcome.append(party.load_state(party.run, 0))
        except PartyRefusal as error:
            outcome.append(error)

    loader = threading.Thread(target=load)
    loader.start()
    while not waiting.is_set() and loader.is_alive():
        loader.join(0.01)
    finish.set()
    release.join(60)
    loader.join(60)
    assert waiting.is_set()
    assert isinstance(outcome[0], PartyRefusal), outcome
    assert "it loads state only to resume" in str(outcome[0])


def test_the_bytes_counted_for_arrays_and_blobs_are_what_ray_serializes():
    generator = np.random.default_rng(0)
    for shape, dtype in (((32, 16), np.float32), ((32, 16), np.uint8), ((5,), np.int64)):
        for _ in range(2):
            array = (generator.random(shape) * 100).astype(dtype)
            assert array_bytes(array) == serialized_bytes(array)
    for length in (0, 17, 2088):
        blob = generator.integers(0, 256, length, dtype=np.uint8).tobytes()
        assert blob_bytes(blob) == serialized_bytes(blob)


@pytest.mark.parametrize("algo", ["pbm", pytest.param("fedpbcd", marks=pytest.mark.slow)])
def test_a_ray_run_on_a_compiled_graph_is_the_local_run(make_cfg, ray_session, algo):
    """runtime.exchange=compiled: the same model digest, ledger and metrics as the local run
    (PBM: pair masks, evaluation restarts, a checkpoint; FedPBCD: local steps, anchors and the
    learning-rate schedule, carried by the next request). Ray tasks, the default, are
    ``tests/test_ray_runtime.py``'s."""
    steps = ["algo.local_steps=2"] if algo == "fedpbcd" else []
    common = [f"algo={algo}", *steps, *RAY_TWO_PARTIES, "trainer.max_epochs=2"]
    common += ["trainer.limit_train_batches=3"]
    local_cfg = make_cfg(*common)
    ray_cfg = make_cfg(
        *common, "runtime=ray", "runtime.party_seeds=derived", "runtime.exchange=compiled"
    )
    local, remote = train(local_cfg), train(ray_cfg)
    assert remote["model_digest"] == local["model_digest"]
    assert ledger(ray_cfg) == ledger(local_cfg)
    for key in ("val/acc", "test/acc", "comm/uplink_mb", "comm/downlink_mb"):
        assert remote[key] == local[key], key
