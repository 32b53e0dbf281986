"""Secure-aggregation masks are never reused: training, validation, test and sanity releases use
disjoint mask streams, across epochs and across a resume."""

from pathlib import Path

import pytest
import torch

from vfl_lightning.mechanisms import PBM
from vfl_lightning.mechanisms.base import release_round
from vfl_lightning.mechanisms.secure_agg import PairwiseMasking
from vfl_lightning.train import train


@pytest.fixture
def recorded_keys(monkeypatch):
    """Every (pair, round) stream whose masks PairwiseMasking applies to a release during the
    test, with its PRG key. (Masks may be expanded a few rounds ahead of their use; a stream
    expanded but never applied releases nothing.)"""
    used: list[tuple[int, int, int]] = []
    original = PairwiseMasking.mask_stacked

    def recording(self, secrets, round):
        used.extend((pair, int(round), key) for pair, key in enumerate(self.stream_keys(round)))
        return original(self, secrets, round)

    monkeypatch.setattr(PairwiseMasking, "mask_stacked", recording)
    return used


def test_no_mask_stream_is_used_twice_with_validation_test_sanity_and_resume(
    make_cfg, recorded_keys
):
    common = [
        "algo=pbm",
        "trainer.num_sanity_val_steps=1",
        "trainer.limit_train_batches=3",
        "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2",
        "data.eval_batch_size=128",
    ]
    first = make_cfg(*common, "trainer.max_epochs=2")
    train(first)
    releases_first_run = len(recorded_keys)
    resumed = make_cfg(
        *common,
        "trainer.max_epochs=3",
        f"ckpt_path={Path(first.paths.output_dir) / 'checkpoints' / 'last.ckpt'}",
    )
    train(resumed)
    pairs = PBM(num_parties=4, b=16, beta=0.15).masking.num_pairs
    # run 1: sanity 1 + 3 train x 2 epochs + 2 val x 2 epochs + 2 test; run 2 (a resume, no
    # sanity check): 3 train + 2 val + 2 test, each release expanding one stream per pair
    assert releases_first_run == pairs * (1 + 6 + 4 + 2)
    assert len(recorded_keys) == pairs * (1 + 6 + 4 + 2 + 3 + 2 + 2)
    streams = [(pair, round) for pair, round, _ in recorded_keys]
    assert len(set(streams)) == len(streams)
    keys = [(pair, key) for pair, _, key in recorded_keys]
    assert len(set(keys)) == len(keys)
    training_rounds = sorted({round for _, round, _ in recorded_keys if round < 2**56})
    assert training_rounds == list(range(9))


def test_evaluation_rounds_leave_the_training_range_and_each_other():
    pbm = PBM(num_parties=3, b=4, beta=0.1)
    embeddings = [torch.zeros(2, 3)] * 3
    seen = []
    original = pbm.release

    def spy(embeddings, *, generator=None, round=0):
        seen.append(round)
        return original(embeddings, generator=generator, round=round)

    pbm.release = spy
    for stream in ("val", "test", "sanity", "predict", "val"):
        pbm.evaluate(embeddings, stream=stream)
    pbm.begin_evaluation("val", training_round=5)
    pbm.evaluate(embeddings, stream="val")
    assert seen == [
        release_round("val", 0),
        release_round("test", 0),
        release_round("sanity", 0),
        release_round("predict", 0),
        release_round("val", 1),
        release_round("val", 5 << 24),
    ]
    assert min(seen) >= 2**56 and len(set(seen)) == len(seen)
    restored = PBM(num_parties=3, b=4, beta=0.1)
    restored.load_state_dict(pbm.state_dict())
    assert (
        restored.eval_releases
        == pbm.eval_releases
        == {
            "val": (5 << 24) + 1,
            "test": 1,
            "sanity": 1,
            "predict": 1,
        }
    )


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: release_round("eval", 0), r"release stream must be one of .*got 'eval'"),
        (lambda: release_round("val", 2**56), r"release index must be in \[0, 2\^56\), got"),
        (lambda: PairwiseMasking(3, 4).stream_keys(-1), r"round must be in \[0, 2\^64\), got -1"),
        (
            lambda: PBM(num_parties=2, b=4, beta=0.1).evaluate([torch.zeros(1)] * 2, stream="x"),
            r"evaluation stream must be one of \('val', 'test', 'sanity', 'predict'\), got 'x'",
        ),
    ],
)
def test_bad_stream_arguments(call, message):
    with pytest.raises(ValueError, match=message):
        call()
