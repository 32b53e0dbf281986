"""Properties docs/threat_model.md states that no other test checks: PBM hides features, not
labels (the gradient every party receives gives the label of every training sample)."""

from __future__ import annotations

from test_label_inference import _attack


def test_pbm_protects_features_not_labels(make_cfg):
    """A curious party reads every training label from PBM's downlink gradients (the attack
    setting of attack=label_inference: summed per-class outputs, a bias-only head); so does an
    eavesdropper on that party's downlink. PBM's noise is on the uplink embeddings only."""
    results = _attack(make_cfg, "pbm", "~mechanism.fusion")
    assert results["attack/label_inference/acc"] >= 0.95
    assert results["attack/label_inference/eavesdropper_acc"] >= 0.95
