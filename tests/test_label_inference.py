"""Label inference (Fu et al. direct attack) from the wire: the math, and the attack callback on
first-order protocols (succeeds) and on cascade (near chance)."""

import json
from pathlib import Path

import pytest
import torch

from vfl_lightning.privacy.attacks.label_inference import (
    ClientObservation,
    estimate_output_gradient,
    infer_labels,
    labels_from_gradient,
)
from vfl_lightning.train import train


def test_gradient_of_a_summed_softmax_output_gives_every_label():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(500, 10, generator=gen) * 3
    y = torch.randint(0, 10, (500,), generator=gen)
    gradient = (logits.softmax(-1) - torch.nn.functional.one_hot(y, 10)) / 500
    assert torch.equal(labels_from_gradient(gradient), y)


def test_many_known_displacements_recover_the_labels_random_ones_do_not():
    gen = torch.Generator().manual_seed(1)
    b, c, q = 8, 10, 2000
    y = torch.randint(0, c, (b,), generator=gen)
    gradient = (torch.full((b, c), 0.1) - torch.nn.functional.one_hot(y, c)).double()
    displacements = 1e-3 * torch.randn(q, b, c, generator=gen, dtype=torch.float64)
    base = torch.tensor(2.3, dtype=torch.float64)
    losses = torch.cat([base[None], base + (displacements * gradient).sum((1, 2))])
    estimate = estimate_output_gradient(losses, displacements)
    assert torch.equal(labels_from_gradient(estimate), y)
    observation = ClientObservation("loss", losses, displacements)
    assert torch.equal(infer_labels(observation), y)
    guesses = torch.stack(
        [infer_labels(observation, knows_perturbation=False, generator=gen) for _ in range(20)]
    )
    assert (guesses == y).double().mean() < 0.2


def _attack(make_cfg, algo, *extra):
    cfg = make_cfg(
        f"algo={algo}",
        "attack=label_inference",
        "trainer.max_epochs=2",
        "trainer.limit_val_batches=1",
        "test=false",
        "data.batch_size=64",
        "callbacks.checkpoint=null",
        *extra,
    )
    results = train(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert written["attack/label_inference/acc"] == results["attack/label_inference/acc"]
    assert results["attack/label_inference/observed_samples"] > 500
    return results


@pytest.mark.parametrize("algo", ["npq", pytest.param("vafl", marks=pytest.mark.slow)])
def test_attack_reads_labels_from_first_order_gradients(make_cfg, algo):
    results = _attack(make_cfg, algo)
    assert results["attack/label_inference/acc"] >= 0.95
    assert results["attack/label_inference/eavesdropper_acc"] >= 0.95


def test_attack_is_near_chance_on_cascade(make_cfg):
    results = _attack(make_cfg, "cascade")
    assert results["attack/label_inference/acc"] <= 0.1 + 0.1
    assert results["attack/label_inference/eavesdropper_acc"] <= 0.1 + 0.1


def test_attack_refuses_a_model_outside_its_threat_model(make_cfg):
    cfg = make_cfg("algo=npq", "attack=label_inference", "callbacks.label_inference.party=4")
    with pytest.raises(ValueError, match=r"attack.party must be in \[0, 3\], got 4"):
        train(cfg)
    cfg = make_cfg("algo=npq", "attack=label_inference", "head=linear", "party.embedding_dim=16")
    with pytest.raises(ValueError, match=r"needs party outputs with num_classes=10 entries"):
        train(cfg)
