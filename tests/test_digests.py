"""Model digests of reference 2-epoch runs (logger=none, seed 0): a refactor must reproduce every
parameter bit for bit, so each digest here is the one these runs have always printed."""

from __future__ import annotations

import pytest
from conftest import compose_config

from vfl_lightning.train import train

REFERENCE_DIGESTS = {
    "algo=npq": "672b8746ec0c59389c00cdb04e94394054d343b60f956a276b5bc4ad93bbe22f",
    "algo=pbm": "fc62a7828d10a2823833d36b19b3297e215b89e8a91ae2c04330829cabb69635",
    "algo=ldp": "54b64192ab4bd385bf48b1ac72e5b5b3a1c56142bee2696b7f997f1fe5a62bec",
    "algo=fedbcd": "096e91a112a0a9c1a860902b47dffeb699e1adb3d898af2291bc002a8b43d833",
    "algo=splitnn": "328677c8da951e5df7e93cbad94843b4b18bc8f19eb2a468c4abf18915426f74",
    "experiment=cascade_digits": "174bc317946c4ee60f7f5f6277fb8a97a3ef011bd39257c9c84429577b5dd324",
    "experiment=fedvs_digits": "bb96c0de828752a0d847952924d4a3b1820d00c9c6a02e1656661f29ac00d0e6",
    "experiment=fedbcd_digits": "22ecc2f2f929988e27ae60f203abe4c3469e2fc3253dd7673570b86e551d1d40",
}


@pytest.mark.parametrize("override", sorted(REFERENCE_DIGESTS))
def test_reference_digest(tmp_path, override):
    """The 8 runs take about 4 s together, so all of them stay in the default suite."""
    cfg = compose_config(tmp_path, override, "seed=0", "trainer.max_epochs=2")
    results = train(cfg)
    assert results["model_digest"] == REFERENCE_DIGESTS[override]
    reported = {"train/loss_epoch", "train/acc", "val/loss", "val/acc", "test/acc"}
    assert reported <= set(results), "fit and test metrics both reach results.json"
