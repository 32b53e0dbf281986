"""PBM-VFL end to end on digits: the paper's accuracy ordering, privacy logging, resume, real bits."""

import json
import math
from pathlib import Path

import pytest
import torch
from conftest import compose_config

from vfl_lightning.train import train


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: several torch threads on 2 shared cores make each step ~10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def run(tmp_path: Path, name: str, overrides: list[str]) -> dict:
    """train() on experiment=pbm_digits with a larger step (lr 0.05) so 4 epochs separate settings."""
    return train(
        compose_config(tmp_path / name, "experiment=pbm_digits", "optimizer.lr=0.05", *overrides)
    )


def mean_test_accuracy(tmp_path: Path, algo: str, b: int, beta: float) -> float:
    accuracies = [
        run(
            tmp_path,
            f"{algo}-{b}-{beta}-{seed}",
            [
                f"algo={algo}",
                f"mechanism.b={b}",
                f"mechanism.beta={beta}",
                f"seed={seed}",
                "trainer.max_epochs=4",
            ],
        )["test/acc"]
        for seed in (0, 1)
    ]
    return sum(accuracies) / len(accuracies)


def test_accuracy_ordering_of_the_paper(tmp_path):
    """PBM(b=16, β=0.15) beats PBM(b=2, β=0.05) and LDP at the same (b, β), averaged over 2 seeds.

    At (2, 0.05) the PBM estimate has standard deviation sqrt(M/(4β²b)) = 14 per element against
    a signal of at most 4, and matched LDP at (16, 0.15) adds σ ≈ 4.7 per party: both stay near
    chance (0.1), while PBM(16, 0.15) (standard deviation 1.7) learns.
    """
    strong = mean_test_accuracy(tmp_path, "pbm", 16, 0.15)
    weak = mean_test_accuracy(tmp_path, "pbm", 2, 0.05)
    ldp = mean_test_accuracy(tmp_path, "ldp", 16, 0.15)
    assert strong >= weak + 0.15, (strong, weak)
    assert strong >= ldp + 0.15, (strong, ldp)
    assert strong > 0.5


def test_privacy_logged_saved_and_resumed(tmp_path):
    """With the sanity check on (the default's 2 batches), a resumed run accounts the same
    training and evaluation releases as the uninterrupted one: it does not repeat the sanity
    check the run it continues made."""
    common = [
        "mechanism.b=4",
        "mechanism.beta=0.1",
        "++trainer.limit_train_batches=3",
        "trainer.num_sanity_val_steps=2",
        "test=false",
    ]
    straight = run(tmp_path, "straight", [*common, "trainer.max_epochs=3"])
    first = run(tmp_path, "first", [*common, "trainer.max_epochs=2"])
    resumed = run(
        tmp_path, "resumed", [*common, "trainer.max_epochs=3", f"ckpt_path={first['checkpoint']}"]
    )
    written = json.loads((tmp_path / "straight" / "results.json").read_text())
    for key in ("privacy/feature_eps", "privacy/sample_eps", "privacy/alpha"):
        assert written[key] == straight[key]
    assert first["privacy/feature_eps"] < straight["privacy/feature_eps"]
    assert resumed["privacy/feature_eps"] == pytest.approx(
        straight["privacy/feature_eps"], rel=1e-12
    )
    assert resumed["privacy/sample_eps"] == pytest.approx(straight["privacy/sample_eps"], rel=1e-12)
    assert resumed["privacy/eval_feature_eps"] == straight["privacy/eval_feature_eps"]
    assert resumed["privacy/eval_feature_eps"] > first["privacy/eval_feature_eps"] > 0
    assert resumed["model_digest"] == straight["model_digest"]
    assert resumed["privacy/uses_per_sample"] == pytest.approx(3 * 300 / 1257)
    assert straight["privacy/sample_eps"] > straight["privacy/feature_eps"] > 0
    assert straight["privacy/alpha"] > 1
    assert 0.0 <= straight["pbm/clip_fraction"] <= 1.0
    # uplink: 4 parties x 16 elements x ceil(log2(4*4+1)) = 5 bits per sample; downlink float32
    samples = 9 * 100
    assert straight["comm/uplink_mb"] == pytest.approx(samples * 4 * 16 * 5 / 8 / 1e6)
    assert straight["comm/downlink_mb"] == pytest.approx(samples * 4 * 16 * 32 / 8 / 1e6)
    assert not math.isnan(straight["val/acc"])
