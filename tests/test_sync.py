"""Synchronous split training: faithful gradients, ledger counts, global_step convention."""

import copy
import math

import pytest
import torch
from conftest import fit

from vfl_lightning.mechanisms import fuse_tensors


def _first_batch(datamodule):
    loader = datamodule.train_dataloader()
    loader.sampler.set_epoch(0)
    return next(iter(loader))


@pytest.mark.parametrize(
    ("algo", "data", "parties", "fusion"),
    [
        ("npq", "digits", 4, "sum"),
        ("splitnn", "digits", 4, "concat"),
        ("npq", "breast_cancer", 3, "mean"),
        ("splitnn", "breast_cancer", 7, "concat"),
    ],
)
def test_wire_gradients_equal_centralized_gradients(make_cfg, algo, data, parties, fusion):
    cfg = make_cfg(
        f"algo={algo}",
        f"data={data}",
        f"data.num_parties={parties}",
        "data.partition=" + ("quadrants" if data == "digits" else "even"),
        f"mechanism.fusion={fusion}",
        "optimizer.momentum=0",
        "trainer.max_steps=1",
        "trainer.limit_val_batches=0",
    )
    import lightning as L

    from vfl_lightning.train import build

    L.seed_everything(cfg.seed)
    datamodule, fresh = build(cfg)
    central_parties = copy.deepcopy(fresh.parties)
    central_head = copy.deepcopy(fresh.head)
    from hydra.utils import instantiate

    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[])
    trainer.fit(fresh, datamodule=datamodule)

    xs, y, _ = _first_batch(datamodule)
    hs = [p(x) for p, x in zip(central_parties, xs)]
    for h in hs:
        h.retain_grad()
    loss = torch.nn.functional.cross_entropy(central_head(fuse_tensors(hs, fusion)), y)
    loss.backward()

    received = fresh.wire.observed["down"]
    for m in range(parties):
        torch.testing.assert_close(received[m], hs[m].grad, rtol=1e-5, atol=1e-7)
    for vfl_part, central_part in [
        *zip(fresh.parties, central_parties),
        (fresh.head, central_head),
    ]:
        for p_vfl, p_central in zip(vfl_part.parameters(), central_part.parameters()):
            torch.testing.assert_close(p_vfl.grad, p_central.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(("algo", "fusion_width"), [("npq", 16), ("splitnn", 16)])
def test_ledger_counts_float32_embeddings_and_gradients(make_cfg, algo, fusion_width):
    batch, parties, steps = 32, 4, 5
    cfg = make_cfg(
        f"algo={algo}",
        f"data.batch_size={batch}",
        "data.drop_last=true",
        f"party.embedding_dim={fusion_width}",
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
        "algo.transcript_size=100",
    )
    trainer, module, _ = fit(cfg)
    per_round = batch * parties * fusion_width * 32
    ledger = module.wire.ledger
    assert ledger.rounds == steps
    assert ledger.total_bits("up") == steps * per_round
    assert ledger.total_bits("down") == steps * per_round
    assert ledger.bits["up"] == [steps * per_round // parties] * parties
    kinds = [(e.round, e.direction, e.party) for e in ledger.transcript]
    expected = [(r, d, m) for r in range(steps) for d in ("up", "down") for m in range(parties)]
    assert kinds == expected


def test_global_step_counts_server_updates_equal_rounds(make_cfg):
    cfg = make_cfg("trainer.max_steps=7", "trainer.limit_val_batches=0")
    trainer, module, _ = fit(cfg)
    assert trainer.global_step == 7
    assert module.wire.ledger.rounds == 7


def test_float16_amp_is_refused():
    # On CPU Lightning turns 16-mixed into bf16-mixed itself, so the check is called directly.
    from vfl_lightning.algorithms import VFLModule

    VFLModule.check_precision("bf16-mixed")
    with pytest.raises(ValueError, match="trainer.precision must be one of .*got '16-mixed'"):
        VFLModule.check_precision("16-mixed")


@pytest.mark.parametrize(
    ("algo", "uplink_bits"), [("pbm", math.log(16 * 4)), ("npq", 32.0), ("splitnn", None)]
)
def test_paper_cost_formula_beside_the_ledger(make_cfg, algo, uplink_bits):
    """PBM-VFL's T·B·M·P·(log(bM) + F) with natural log and F = 32 (npq, ldp: F up)."""
    batch, parties, width, steps = 32, 4, 16, 5
    cfg = make_cfg(
        f"algo={algo}",
        "mechanism.b=16" if algo == "pbm" else "trainer.max_epochs=1",
        f"data.batch_size={batch}",
        "data.drop_last=true",
        f"party.embedding_dim={width}",
        f"trainer.max_steps={steps}",
        "trainer.limit_val_batches=0",
    )
    _, module, _ = fit(cfg)
    results = module.results()
    if uplink_bits is None:
        assert "comm/paper_cost_bits" not in results
        return
    elements = steps * batch * parties * width
    assert results["comm/paper_cost_bits"] == pytest.approx(
        elements * (uplink_bits + 32), rel=1e-12
    )
    # the ledger's own PBM width: ceil(log2(M b + 1)) = 7 bits for M = 4, b = 16
    assert module.wire.ledger.total_bits("up") == elements * (7 if algo == "pbm" else 32)
