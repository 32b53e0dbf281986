"""runtime=ray aligns by the PSI between the server and the party actors, with the local run's
result; an actor sends nothing before it is aligned. (In a file after test_party_surface.py:
``ray.remote`` wraps an actor class's methods in this process.)"""

from __future__ import annotations

import pytest
import torch
from conftest import RAY_TWO_PARTIES as TWO_PARTIES
from conftest import compose_config

from vfl_lightning.train import train

pytest.importorskip("rbcl")
SHORT = ["trainer.max_epochs=1", "trainer.limit_train_batches=4", "trainer.limit_val_batches=1"]
SHORT += ["test=false"]


@pytest.mark.slow
def test_ray_aligns_between_the_actors_and_equals_local(make_cfg, ray_session):
    common = ["algo=pbm", *TWO_PARTIES, *SHORT, "data.overlap=0.6"]
    local = train(make_cfg(*common))
    remote = train(make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"))
    assert remote["model_digest"] == local["model_digest"]
    for key in ("data/aligned_rows", "comm/psi_mb", "time/simulated_s", "comm/uplink_mb"):
        assert remote[key] == local[key], key
    assert remote["data/aligned_rows"] == round(0.6 * 1797)


def test_a_ray_party_sends_nothing_before_alignment_and_only_blinded_ids_in_it(
    ray_session, tmp_path
):
    """The actor's only PSI call answers bytes: its HELLO holds its ids blinded by a scalar it
    keeps (none of its H(id)); a replayed START and a crafted ALIGN (a row outside the
    intersection it computed) are refused as the party's refusal, one line; it sends no
    embedding before its rows are aligned, nor after a refused ALIGN."""
    import numpy as np
    import ray

    from vfl_lightning.algorithms.party_factory import PartyFactory
    from vfl_lightning.data.alignment import simulate_holdings
    from vfl_lightning.data.psi import (
        ELEMENT_BYTES,
        HEADER,
        HELLO,
        STAGES,
        LabelHolderSession,
        hash_to_group,
    )
    from vfl_lightning.errors import PartyRefusal
    from vfl_lightning.runtime.party_trust import PartyTrust
    from vfl_lightning.runtime.ray_parties import SyncPartyActor

    def refused(ref) -> str:
        with pytest.raises(ray.exceptions.RayTaskError) as error:
            ray.get(ref)
        assert isinstance(error.value.cause, PartyRefusal)
        line = str(error.value.cause)
        assert "\n" not in line and line.startswith("party 0 refused ")
        return line

    cfg = compose_config(tmp_path, "algo=pbm", *TWO_PARTIES, "data.overlap=0.5")
    factory = PartyFactory.from_config(cfg)
    trust = PartyTrust(party_seeds="derived", party_dir=str(tmp_path / "p"), known_parties=None)
    actor = ray.remote(SyncPartyActor).remote(factory, 0, 1, trust)
    before = "party 0 refused send: it releases nothing before the PSI aligned its rows"
    assert refused(actor.send.remote(torch.arange(2), "train", 0)) == before
    ids = np.arange(1797)
    holder = LabelHolderSession(ids, hash_to_group(ids), 0)
    start = holder.start()
    hello = ray.get(actor.psi.remote(start))
    assert hello[7] == HELLO
    own = simulate_holdings(1797, 0.5, 2, seed=0)[0]
    elements = hello[HEADER.size + 1 + 8 :]
    assert len(elements) == len(own) * ELEMENT_BYTES
    blinded = {elements[i : i + ELEMENT_BYTES] for i in range(0, len(elements), ELEMENT_BYTES)}
    assert not blinded & set(hash_to_group(own))
    assert "expects REPLY now" in refused(actor.psi.remote(start))
    found = holder.matches(ray.get(actor.psi.remote(holder.reply(hello))))
    assert np.array_equal(np.sort(found[found >= 0]), np.arange(len(own)))
    # the label holder holds all the party's rows: craft an ALIGN naming a row the party lacks
    crafted = {stage: np.array([], dtype=np.int64) for stage in STAGES}
    crafted["train"] = np.array([len(own)], dtype=np.int64)
    line = refused(actor.psi.remote(holder.align(crafted)))
    assert line.endswith("outside the intersection this party computed")
    assert refused(actor.send.remote(torch.arange(2), "train", 0)) == before
    ray.kill(actor)
