"""Attacks and defenses under runtime=ray read and filter the wire in the server process: the
same observations, results and parameters as runtime=local (derived party seeds)."""

from __future__ import annotations

import pytest
from conftest import RAY_TWO_PARTIES as TWO_PARTIES

from vfl_lightning.errors import ConfigError
from vfl_lightning.train import train


@pytest.mark.slow
def test_ray_attack_and_defense_equal_local(make_cfg, ray_session):
    common = [
        "algo=pbm",
        *TWO_PARTIES,
        "trainer.max_epochs=2",
        "attack=feature_reconstruction",
        "defense=gradient_noise",
    ]
    local = train(make_cfg(*common, "runtime=local"))
    remote = train(make_cfg(*common, "runtime=ray"))
    assert remote["model_digest"] == local["model_digest"]
    for key in ("rel_mse", "label_baseline_rel_mse", "observed_samples"):
        key = f"attack/feature_reconstruction/{key}"
        assert remote[key] == local[key], key
    assert remote["attack/feature_reconstruction/separate_messages"] is False


@pytest.mark.slow
def test_model_completion_needs_the_party_model_in_this_process(make_cfg, ray_session):
    cfg = make_cfg("algo=npq", *TWO_PARTIES, "runtime=ray", "attack=model_completion")
    with pytest.raises(ConfigError, match=r"the party model lives in a party process"):
        train(cfg)
