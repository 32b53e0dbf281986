"""Label canaries (``audit=canary_label``): ``defense=label_dp`` audited from a passive party's
view, whose guesses come only from the gradients the server sends it."""

from __future__ import annotations

import pytest
import torch

from vfl_lightning.data import VerticalDataModule
from vfl_lightning.errors import ConfigError
from vfl_lightning.train import train

AUDIT = [
    "algo=npq",
    "data.binary=true",
    "audit=canary_label",
    "audit.canary_label.count=500",
    "audit.canary_label.known=100",
    "trainer.max_epochs=5",
    "trainer.limit_val_batches=1",
    "test=false",
    "callbacks.checkpoint=null",
]


def test_label_canaries_set_only_labels():
    specs = {"canary_label": {"level": "label", "count": 40}}
    plain = VerticalDataModule(name="digits", num_parties=4, binary=True)
    data = VerticalDataModule(name="digits", num_parties=4, binary=True, canaries=specs)
    record = data.canary_records["canary_label"]
    train_split, clean = data.splits["train"], plain.splits["train"]
    assert torch.equal(train_split.y[record.rows], record.coins)
    others = torch.ones(len(clean.y), dtype=torch.bool)
    others[record.rows] = False
    assert torch.equal(train_split.y[others], clean.y[others])
    assert all(torch.equal(a, b) for a, b in zip(train_split.xs, clean.xs, strict=True))


def test_label_dp_is_audited_in_the_passive_party_view(make_cfg):
    """ε = 1 label DP: the party's bound is positive and below ε (measured 0.89); without a
    label defense the labels are used as they are (ε = ∞) and the bound is far larger."""
    defended = train(make_cfg(*AUDIT, "defense=label_dp", "defense.epsilon=1.0"))
    assert defended["audit/canary_label/eps_accountant"] == 1.0
    assert 0.3 < defended["audit/canary_label/eps_lower"] <= 1.0
    assert defended["audit/canary_label/family"] == "epsilon_delta"
    plain = train(make_cfg(*AUDIT))
    assert plain["audit/canary_label/eps_accountant"] == "inf"
    assert plain["audit/canary_label/eps_lower"] > 3.0
    assert plain["audit/canary_label/guess_acc"] > 0.95


def test_label_audit_refusals(make_cfg):
    with pytest.raises(ConfigError, match=r"^audit=canary_label: algo=zoo_vfl sends its clients"):
        train(make_cfg("algo=zoo_vfl", "audit=canary_label", "trainer.max_epochs=1", *AUDIT[-3:]))
    with pytest.raises(ConfigError, match=r"^audit=canary_label: the FedVS family sends coded"):
        train(make_cfg("experiment=fedvs_digits", "audit=canary_label", *AUDIT[-3:]))
