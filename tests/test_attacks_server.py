"""Feature reconstruction by the server: the decoder math, the validation cases (split learning
leaks, a constant party model leaks nothing, PBM leaks less as beta falls), the server's view
(never a party module), and the attack leaving training untouched."""

import json
from pathlib import Path

import lightning as L
import pytest
import torch
from torch import nn

from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.attacks.feature_reconstruction import (
    FeatureReconstructor,
    class_means,
    decode,
    fit_decoder,
    relative_mse,
)
from vfl_lightning.privacy.attacks.views import ServerView
from vfl_lightning.train import train

SHORT = ["trainer.limit_val_batches=1", "test=false", "callbacks.checkpoint=null"]


class ConstantParty(nn.Module):
    """A party model whose output ignores its input (a trainable constant)."""

    def __init__(self, input_shape, embedding_dim: int = 16, **unused) -> None:
        super().__init__()
        self.embedding_dim = embedding_dim
        self.value = nn.Parameter(torch.zeros(embedding_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.value.expand(x.shape[0], -1)


def test_decoder_recovers_a_linear_map_and_learns_nothing_from_noise():
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(300, 6, generator=gen, dtype=torch.float64)
    received = features @ torch.randn(6, 8, generator=gen, dtype=torch.float64)
    degree, weights = fit_decoder(received[:100], features[:100])
    decoded = decode(received[100:], degree, weights)
    assert relative_mse(decoded, features[100:], features[:100].mean(0)) < 1e-3
    noise = torch.randn(300, 8, generator=gen, dtype=torch.float64)
    reconstructor = FeatureReconstructor(300, 2)
    reconstructor.observe(ServerView(torch.arange(300), torch.zeros(300).long(), noise, True))
    out = reconstructor.reconstruct(torch.arange(100), features[:100], torch.arange(100, 300))
    assert 0.95 < relative_mse(out["decoded"], features[100:], features[:100].mean(0)) < 1.1


def test_class_means_are_the_labels_only_baseline():
    features = torch.tensor([[1.0], [3.0], [10.0]])
    means = class_means(torch.tensor([0, 0, 1]), features, 3)
    assert means.squeeze(1).tolist() == [2.0, 10.0, 14.0 / 3.0]


def _reconstruct(make_cfg, *overrides):
    cfg = make_cfg("attack=feature_reconstruction", *SHORT, *overrides)
    results = train(cfg)
    written = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert written["attack/feature_reconstruction/rel_mse"] == pytest.approx(
        results["attack/feature_reconstruction/rel_mse"]
    )
    return results


def test_split_learning_leaks_the_target_party_features(make_cfg):
    results = _reconstruct(make_cfg, "algo=splitnn", "trainer.max_epochs=3")
    assert results["attack/feature_reconstruction/rel_mse"] <= 0.5
    assert results["attack/feature_reconstruction/separate_messages"] is True
    assert len(results["attack/feature_reconstruction/r2"]) == 16
    config = results["attack/feature_reconstruction/config"]
    assert config == {
        "role": "server",
        "assumptions": "raw features of target_party for an aux_fraction of training samples",
        "aux_fraction": 0.1,
        "target_party": 0,
    }
    assert 0.0 < results["attack/feature_reconstruction/dcs"] < 1.0


def test_a_constant_party_model_leaks_nothing(make_cfg):
    results = _reconstruct(
        make_cfg,
        "algo=splitnn",
        "trainer.max_epochs=1",
        "party._target_=" + __name__ + ".ConstantParty",
    )
    assert 0.95 <= results["attack/feature_reconstruction/rel_mse"] <= 1.1


def test_the_adversary_sees_only_the_server_view(make_cfg, monkeypatch):
    seen, adversaries = [], set()
    observe = FeatureReconstructor.observe

    def spy(self, view):
        seen.append(view)
        adversaries.add(self)
        return observe(self, view)

    monkeypatch.setattr(FeatureReconstructor, "observe", spy)
    cfg = make_cfg("algo=npq", "attack=feature_reconstruction", "trainer.max_epochs=1", *SHORT)
    train(cfg)
    assert len(seen) == 40  # one view per training batch (1257 rows, batches of 32)
    for view in seen:
        assert type(view) is ServerView
        assert all(
            isinstance(getattr(view, field), torch.Tensor | bool)
            for field in ("idx", "labels", "received", "separate")
        )
    (adversary,) = adversaries
    held = vars(adversary).values()
    assert all(isinstance(value, torch.Tensor | bool | int) for value in held)
    assert not any(isinstance(value, nn.Module) for value in held)


def test_the_attack_does_not_change_training(make_cfg):
    plain = train(make_cfg("algo=pbm", "trainer.max_epochs=1", *SHORT))
    attacked = train(
        make_cfg("algo=pbm", "attack=feature_reconstruction", "trainer.max_epochs=1", *SHORT)
    )
    assert attacked["model_digest"] == plain["model_digest"]
    assert attacked["attack/feature_reconstruction/separate_messages"] is False


class RecordHeadInputs(L.Callback):
    """The head's input of every training batch (what the server fed its head), by sample id
    (class attributes: Hydra builds the instance)."""

    rows: dict[int, torch.Tensor] = {}
    idx: torch.Tensor | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        RecordHeadInputs.rows = {}
        pl_module.head.register_forward_pre_hook(self.keep)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        RecordHeadInputs.idx = batch[2]

    def keep(self, module, inputs) -> None:
        if module.training and RecordHeadInputs.idx is not None:
            for i, row in zip(RecordHeadInputs.idx.tolist(), inputs[0].detach(), strict=True):
                RecordHeadInputs.rows[i] = row.clone()


def test_under_fedvs_the_server_decodes_the_average_it_trained_on(make_cfg, monkeypatch):
    """FedVS: the server's view is what it decoded from the responders' coded embeddings, the
    very average its head was trained on (not a clean recomputation)."""
    from vfl_lightning.privacy.attacks.server_attacks import FeatureReconstructionAttack

    seen = []
    original = FeatureReconstructionAttack.evaluate

    def keep_view(self, pl_module, datamodule):
        seen.append((self.adversary.seen.clone(), self.adversary.received.clone()))
        return original(self, pl_module, datamodule)

    monkeypatch.setattr(FeatureReconstructionAttack, "evaluate", keep_view)
    record = f"+callbacks.record._target_={__name__}.RecordHeadInputs"
    results = train(
        make_cfg(
            "experiment=fedvs_digits",
            "attack=feature_reconstruction",
            "trainer.max_epochs=1",
            *SHORT,
            record,
        )
    )
    assert results["attack/feature_reconstruction/separate_messages"] is False
    (observed, received) = seen[0]
    rows = RecordHeadInputs.rows
    assert observed.sum() == len(rows) > 100
    for i, row in rows.items():
        assert observed[i] and torch.equal(received[i], row.float())
    assert 0.5 < results["attack/feature_reconstruction/rel_mse"] < 1.5


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["algo=npq", "attack=feature_reconstruction", "attack.target_party=4"],
            r"attack.target_party must be in \[0, 3\], got 4$",
        ),
    ],
)
def test_bad_combinations_are_refused(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(make_cfg(*overrides, "trainer.max_epochs=1", *SHORT))


def test_bad_aux_fraction_is_refused(make_cfg):
    cfg = make_cfg("algo=npq", "attack=feature_reconstruction", "attack.aux_fraction=1.5")
    with pytest.raises(Exception, match=r"attack.aux_fraction must be in \(0, 1\), got 1.5"):
        train(cfg)


def test_pbm_reconstruction_worsens_as_beta_falls(make_cfg):
    means = []
    for beta in (0.25, 0.15, 0.05):
        runs = [
            _reconstruct(
                make_cfg,
                "algo=pbm",
                f"mechanism.beta={beta}",
                f"seed={seed}",
                "trainer.max_epochs=3",
            )
            for seed in (0, 1)
        ]
        means.append(sum(r["attack/feature_reconstruction/rel_mse"] for r in runs) / 2)
    assert means[0] < means[1] < means[2]
