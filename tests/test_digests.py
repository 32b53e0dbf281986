"""Model digests of reference 2-epoch runs (logger=none, seed 0): a refactor must reproduce every
parameter bit for bit. Each run is checked twice: the ``model_digest`` it prints, and one
:func:`tensor_digest` over all its named parameters.

The digests depend on the floating-point kernels that trained the models, so they hold only on the
machine that recorded them (``pinned.CI_MACHINE``, the project's CI machine), where they guard every
refactor; elsewhere those tests skip and say what differs (``tests/pinned.py``), and what holds on
every machine is checked instead: two runs of each reference configuration agree bit for bit."""

from __future__ import annotations

import pytest
from conftest import compose_config
from lightning import Callback
from pinned import CI_MACHINE, require_recording_machine

from vfl_lightning.algorithms.parties import tensor_digest
from vfl_lightning.train import train

PARAMETER_DIGESTS = {
    "algo=npq": "672b8746ec0c59389c00cdb04e94394054d343b60f956a276b5bc4ad93bbe22f",
    "algo=pbm": "fc62a7828d10a2823833d36b19b3297e215b89e8a91ae2c04330829cabb69635",
    "algo=ldp": "54b64192ab4bd385bf48b1ac72e5b5b3a1c56142bee2696b7f997f1fe5a62bec",
    "algo=fedbcd": "096e91a112a0a9c1a860902b47dffeb699e1adb3d898af2291bc002a8b43d833",
    "algo=splitnn": "328677c8da951e5df7e93cbad94843b4b18bc8f19eb2a468c4abf18915426f74",
    "experiment=cascade_digits": "174bc317946c4ee60f7f5f6277fb8a97a3ef011bd39257c9c84429577b5dd324",
    "experiment=fedvs_digits": "bb96c0de828752a0d847952924d4a3b1820d00c9c6a02e1656661f29ac00d0e6",
    "experiment=fedbcd_digits": "22ecc2f2f929988e27ae60f203abe4c3469e2fc3253dd7673570b86e551d1d40",
}
"""One :func:`tensor_digest` over every named parameter (parties 0..M-1 as
``parties.<m>.<name>``, the head, the server's own party model): :class:`ParameterDigest`."""

REFERENCE_DIGESTS = {
    "algo=npq": "bfa284a4b9ca67939addc01052d2b57fb2db7c8927b61499c535825d7edb9273",
    "algo=pbm": "8a53f95e5df965d16d1f2649acb6e342e30db8c2cc04bac5269e95106bdea8cd",
    "algo=ldp": "eb39d0c95238eabe21da29801e3410e825ee263530588bbb4566f6866cfc9c3f",
    "algo=fedbcd": "e6fb767a2c229b3534d53607fe52e8635bdbf523c8f25c94db009b49bf1ad17d",
    "algo=splitnn": "8c85cd76a6a98147f57f3a28c3493709a1686b9cf0eeb9d50aca0ad7a0cb517a",
    "experiment=cascade_digits": "8f48684ded6f757a7654f58f51f987ab2cadc547b1bd4342fc7b3873cf63e872",
    "experiment=fedvs_digits": "b9b32aac359000952360d624f46b45d17b6d06df30cb555aa162aca55e63ee8e",
    "experiment=fedbcd_digits": "96d72a5ef466fa7ee4b1afcaeff4906cea8999ffe80d346ebe53b78be4353f6d",
}
"""``model_digest`` as the run prints it: SHA-256 over each holder's own parameter digest."""


class ParameterDigest(Callback):
    """Records one digest over all named parameters of a local run's module at the end of fit."""

    value: str | None = None

    def on_fit_end(self, trainer, pl_module) -> None:
        named = [(f"parties.{n}", p) for n, p in pl_module.parties.named_parameters()]
        named += [(f"head.{n}", p) for n, p in pl_module.head.named_parameters()]
        if pl_module.server_party is not None:
            own = pl_module.server_party.named_parameters()
            named += [(f"server_party.{n}", p) for n, p in own]
        ParameterDigest.value = tensor_digest(named).hexdigest()


def reference_run(tmp_path, override) -> tuple[str | None, dict]:
    """One reference run: its :class:`ParameterDigest` and its results."""
    record = "+callbacks.parameters._target_=test_digests.ParameterDigest"
    cfg = compose_config(tmp_path, override, "seed=0", "trainer.max_epochs=2", record)
    ParameterDigest.value = None
    results = train(cfg)
    return ParameterDigest.value, results


@pytest.mark.parametrize("override", sorted(PARAMETER_DIGESTS))
def test_reference_run_is_deterministic_on_this_machine(tmp_path, override):
    """On any machine: two runs of a reference configuration give the same parameters bit for
    bit (what the pinned digests below rely on, checked where they cannot be)."""
    first, results = reference_run(tmp_path / "first", override)
    second, again = reference_run(tmp_path / "second", override)
    assert first is not None and first == second, "two runs on this machine differ"
    assert results["model_digest"] == again["model_digest"]


@pytest.mark.parametrize("override", sorted(PARAMETER_DIGESTS))
def test_reference_digest(tmp_path, override):
    """The 8 runs take about 4 s together, so all of them stay in the default suite."""
    require_recording_machine(CI_MACHINE)
    digest, results = reference_run(tmp_path, override)
    assert digest == PARAMETER_DIGESTS[override], "the parameters moved"
    assert results["model_digest"] == REFERENCE_DIGESTS[override]
    reported = {"train/loss_epoch", "train/acc", "val/loss", "val/acc", "test/acc"}
    assert reported <= set(results), "fit and test metrics both reach results.json"
