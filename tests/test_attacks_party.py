"""Attacks by a passive party: norm and direction scoring (leak AUC) on a binary task, with and
without label DP, passive model completion, the scores (AUC, DCS) and the refusals."""

import math
from types import SimpleNamespace

import pytest
import torch
from sklearn.metrics import roc_auc_score

from vfl_lightning.errors import ConfigError
from vfl_lightning.privacy.analysis.dcs import defense_capability_score
from vfl_lightning.privacy.attacks.label_scoring import direction_scores, norm_scores
from vfl_lightning.privacy.attacks.party_attacks import ModelCompletionAttack
from vfl_lightning.privacy.attacks.scores import leak_auc, roc_auc
from vfl_lightning.train import train

SHORT = ["trainer.limit_val_batches=1", "callbacks.checkpoint=null"]
BINARY = ["algo=npq", "data=breast_cancer", "trainer.max_epochs=3", *SHORT]


def test_auc_is_the_mann_whitney_statistic_with_ties():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 5, (300,), generator=gen).float()
    labels = torch.randint(0, 2, (300,), generator=gen)
    assert roc_auc(scores, labels) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)
    assert leak_auc(-scores, labels) == pytest.approx(
        max(roc_auc(scores, labels), 1 - roc_auc(scores, labels))
    )
    with pytest.raises(ValueError, match=r"AUC needs both classes, got 0 positive and 3 negative"):
        roc_auc(torch.ones(3), torch.zeros(3))


def test_dcs_is_vflair_formula():
    value = defense_capability_score(
        attack_performance=0.9, attack_baseline=0.5, main_performance=0.8, main_reference=0.9
    )
    assert value == pytest.approx(1 / (1 + math.sqrt(0.5 * 0.4**2 + 0.5 * 0.1**2)))
    assert (
        defense_capability_score(
            attack_performance=0.5, attack_baseline=0.5, main_performance=0.9, main_reference=0.9
        )
        == 1.0
    )
    with pytest.raises(ValueError, match=r"DCS beta must be in \[0, 1\], got 2"):
        defense_capability_score(
            attack_performance=0, attack_baseline=0, main_performance=0, main_reference=0, beta=2
        )


def test_scoring_separates_the_classes_of_a_softmax_gradient():
    gen = torch.Generator().manual_seed(1)
    y = torch.randint(0, 2, (64,), generator=gen)
    p1 = torch.where(y == 1, 0.7, 0.4)  # the positives are fitted worse
    error = torch.stack([1 - p1, p1], 1) - torch.nn.functional.one_hot(y, 2)
    gradient = error @ torch.randn(2, 8, generator=gen)
    assert leak_auc(norm_scores(gradient), y) == 1.0
    known = int((y == 1).nonzero()[0, 0])
    assert leak_auc(direction_scores(gradient, known), y) == 1.0


def test_an_unprotected_binary_task_leaks_its_labels_and_label_dp_stops_it(make_cfg):
    attacks = "attack=[norm_scoring,direction_scoring]"
    plain = train(make_cfg(*BINARY, attacks))
    assert plain["attack/norm_scoring/auc"] >= 0.85
    assert plain["attack/direction_scoring/auc"] >= 0.99
    assert plain["attack/norm_scoring/config"]["role"] == "party"
    assert plain["attack/norm_scoring/dcs"] < 0.95
    protected = train(make_cfg(*BINARY, attacks, "defense=label_dp", "defense.epsilon=0.1"))
    assert protected["defense/name"] == "label_dp"
    assert 0.4 <= protected["defense/flipped_fraction"] <= 0.6
    for attack in ("norm_scoring", "direction_scoring"):
        assert protected[f"attack/{attack}/auc"] <= 0.6
        # a defended run's DCS needs the undefended accuracy (MP*), which it does not know
        assert protected[f"attack/{attack}/dcs"] is None


def test_model_completion_beats_chance_with_four_labels_per_class(make_cfg):
    results = train(
        make_cfg("algo=splitnn", "attack=model_completion", "trainer.max_epochs=3", *SHORT)
    )
    assert results["attack/model_completion/labelled_samples"] == 40
    assert results["attack/model_completion/acc"] >= 0.3  # chance: 0.1 (one quadrant of digits)


def test_model_completion_refuses_a_party_model_in_another_process():
    attack = ModelCompletionAttack()
    actors_only = SimpleNamespace(num_parties=2, parties=[], name="npq")
    with pytest.raises(
        ConfigError, match=r"^attack=model_completion \(party role\): the party model"
    ):
        attack.check(actors_only, SimpleNamespace(splits={}))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=npq", "attack=norm_scoring"], r"needs a binary task, got 10 classes$"),
        (
            ["algo=cascade", "data=breast_cancer", "attack=direction_scoring"],
            r"^attack=direction_scoring \(party role\): algo=cascade clients receive loss values",
        ),
        (
            ["algo=npq", "attack=model_completion", "attack.party=7"],
            r"attack.party must be in \[0, 3\], got 7$",
        ),
        (
            ["algo=cascade", "defense=gradient_noise"],
            r"^defense=gradient_noise: algo=cascade sends its clients loss values, not gradients",
        ),
        (
            ["experiment=fedvs_digits", "defense=gradient_sparsification"],
            r"^defense=gradient_sparsification: algo=fedvs broadcasts one gradient",
        ),
        (
            ["algo=pbm", "defense=dcor"],
            r"^defense=dcor: algo=pbm masks each party's message \(secure aggregation\)",
        ),
    ],
)
def test_bad_combinations_are_refused(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        train(make_cfg(*overrides, "trainer.max_epochs=1", *SHORT))
