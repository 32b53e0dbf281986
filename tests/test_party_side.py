"""The party side shared by every transport: the picklable PartyFactory builds party m as the
local build does, and the one update implementation computes the cut-layer and client steps."""

from __future__ import annotations

import copy
import pickle

import lightning as L
import pytest
import torch
from conftest import compose_config

from vfl_lightning.algorithms.party import (
    PartyOptimization,
    client_update,
    cut_layer_update,
    plain_backward,
)
from vfl_lightning.algorithms.party_factory import PARTY_GROUPS, PartyFactory
from vfl_lightning.algorithms.zoo import ZooSettings, client_estimate, client_query
from vfl_lightning.train import build


def test_factory_builds_each_party_as_the_local_build_does(tmp_path):
    cfg = compose_config(tmp_path, "algo=pbm")
    L.seed_everything(cfg.seed, workers=True, verbose=False)
    datamodule, module = build(cfg)
    factory = pickle.loads(pickle.dumps(PartyFactory.from_config(cfg)))
    assert set(factory.config) == set(PARTY_GROUPS)
    for m in range(len(datamodule.party_shapes)):
        kit = factory.party(m)
        local = dict(module.parties[m].named_parameters())
        remote = dict(kit.model.named_parameters())
        assert local.keys() == remote.keys()
        assert all(torch.equal(local[name], remote[name]) for name in local)
        for stage, split in datamodule.splits.items():
            assert torch.equal(kit.features[stage], split.xs[m])
        assert type(kit.mechanism) is type(module.mechanism)
        assert kit.optimizer.param_groups[0]["params"][0] is next(kit.model.parameters())


def test_factory_refuses_a_config_without_the_party_groups():
    with pytest.raises(ValueError, match=r"missing \['mechanism', 'optimizer'\]$"):
        PartyFactory({"seed": 0, "data": {}, "party": {}})


def linear_party(seed: int = 0) -> tuple[torch.nn.Linear, torch.optim.SGD]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(5, 3)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def optimization(optimizer) -> PartyOptimization:
    return PartyOptimization(zero=optimizer.zero_grad, backward=plain_backward, step=optimizer.step)


def test_cut_layer_update_is_the_received_gradient_plus_the_proximal_term():
    """Linear party h = x W^T + b: dL/dW = g^T x + mu (W - W0), dL/db = sum g + mu (b - b0)."""
    model, optimizer = linear_party()
    x, g = torch.randn(4, 5), torch.randn(4, 3)
    anchor = [p.detach().clone() + 0.5 for p in model.parameters()]
    before = [p.detach().clone() for p in model.parameters()]
    mu = 0.3
    cut_layer_update(
        optimization(optimizer), [model(x)], [g], models=[model], anchors=[anchor], mu=mu
    )
    expected_grads = [
        g.T @ x + mu * (before[0] - anchor[0]),
        g.sum(0) + mu * (before[1] - anchor[1]),
    ]
    for p, old, grad in zip(model.parameters(), before, expected_grads, strict=True):
        torch.testing.assert_close(p.detach(), old - 0.1 * grad)


def test_client_update_first_order_backpropagates_the_answer():
    model, optimizer = linear_party()
    x, g = torch.randn(4, 5), torch.randn(4, 3)
    before = model.weight.detach().clone()
    client_update(optimization(optimizer), model(x), g, model=model, zoo=None)
    torch.testing.assert_close(model.weight.detach(), before - 0.1 * (g.T @ x))


def test_client_update_zoo_steps_along_the_two_point_estimate():
    """A parameter-space ZOO query: the flat estimate of eq. 3 becomes the gradient."""
    model, optimizer = linear_party()
    zoo = ZooSettings(num_directions=2, mu=0.01, direction="gaussian", space="params")
    query = client_query(model, torch.randn(4, 5), zoo, torch.Generator().manual_seed(1))
    losses = torch.tensor([1.0, 1.2, 0.9], dtype=torch.float64)
    flat_before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    estimate = client_estimate(query, losses, zoo)
    client_update(optimization(optimizer), query, losses, model=model, zoo=zoo)
    flat_after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(flat_after, flat_before - 0.1 * estimate.to(flat_before.dtype))
    assert not torch.equal(flat_after, flat_before)


@pytest.mark.parametrize("batch_parties", [True, False])
def test_local_parties_train_without_a_protocol_module(batch_parties):
    """The local party side alone (party models, a mechanism, seeds: no LightningModule): a
    training send and the received gradients step every party as h_m.backward(g_m) and its own
    SGD step would, grouped or one party at a time."""
    from torch import nn

    from vfl_lightning.algorithms.local_parties import LocalParties
    from vfl_lightning.algorithms.parties import ServerStreams
    from vfl_lightning.mechanisms.plain import Plain
    from vfl_lightning.models import MLPEncoder

    torch.manual_seed(0)
    models = nn.ModuleList(MLPEncoder((6,), hidden=(5,), embedding_dim=3) for _ in range(3))
    reference = [copy.deepcopy(m) for m in models]
    parties = LocalParties(
        models, Plain(3), seed=0, streams=ServerStreams(0), batch_parties=batch_parties
    )
    assert (parties.grouped is not None) == batch_parties
    optimizers = parties.make_optimizers(lambda params: torch.optim.SGD(params, lr=0.1))
    xs = [torch.randn(4, 6) for _ in range(3)]
    sent = parties.send(xs, torch.arange(4), stage="train", round=0)
    gradients = [torch.randn(4, 3) for _ in range(3)]
    parties.apply_gradients(gradients)
    assert [opt.param_groups[0]["params"] for opt in optimizers] == [
        list(m.parameters()) for m in models
    ]
    for m, (model, alone) in enumerate(zip(models, reference, strict=True)):
        h = alone(xs[m])
        torch.testing.assert_close(sent[m], h.detach())
        h.backward(gradients[m])
        torch.optim.SGD(alone.parameters(), lr=0.1).step()
        for a, b in zip(model.parameters(), alone.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_the_trainer_checkpoints_the_local_party_sides_optimizers(tmp_path):
    """The party side makes the party optimizers; the trainer wraps and checkpoints the same
    objects (party optimizers first, the server's last)."""
    from hydra.utils import instantiate

    cfg = compose_config(tmp_path, "algo=npq", "trainer.max_steps=2")
    datamodule, module = build(cfg)
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[])
    trainer.fit(module, datamodule=datamodule)
    wrapped = [opt.optimizer for opt in module.optimizers()]
    assert wrapped[:-1] == module.party_side.optimizers
    assert all(a is b for a, b in zip(wrapped, module.party_side.optimizers))
    assert wrapped[-1] is module.server_optimizer().optimizer


@pytest.mark.parametrize("batch_parties", [True, False])
def test_the_local_group_updates_each_party_as_a_lone_party_does(batch_parties):
    """The local parties' grouped update (one autograd pass, one foreach step, grouped fresh
    forward) and a lone :class:`Party` (what a Ray actor wraps), from the same parameters and
    gradients: a training message, a FedBCD fresh local step with FedPBCD's proximal term, and
    the learning-rate factor give the same parameters."""
    from torch import nn

    from vfl_lightning.algorithms.local_parties import LocalParties
    from vfl_lightning.algorithms.parties import PartyGenerators, ServerStreams
    from vfl_lightning.algorithms.party import Party
    from vfl_lightning.mechanisms.plain import Plain
    from vfl_lightning.models import MLPEncoder

    torch.manual_seed(0)
    models = nn.ModuleList(MLPEncoder((6,), hidden=(5,), embedding_dim=3) for _ in range(3))
    lone = [Party(m, copy.deepcopy(model), PartyGenerators(0, m)) for m, model in enumerate(models)]
    group = LocalParties(models, Plain(3), 0, ServerStreams(0), batch_parties=batch_parties)
    sgd = lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.5)  # noqa: E731
    group.make_optimizers(sgd)
    for party in lone:
        party.optimizer = sgd(party.model.parameters())
    assert all(isinstance(party, Party) for party in group.members)
    xs = [torch.randn(4, 6) for _ in range(3)]
    group.set_anchor()
    for party in lone:
        party.set_anchor()
    for fresh, mu, factor in [(False, 0.0, 1.0), (True, 0.2, 0.5), (True, 0.2, 0.25)]:
        gradients = [torch.randn(4, 3) for _ in range(3)]
        if not fresh:
            group.send(xs, torch.arange(4), stage="train", round=None)
            for party, x in zip(lone, xs, strict=True):
                party.keep(x, party.forward(x))
        group.set_lr_factor(factor)
        group.apply_gradients(gradients, fresh=fresh, mu=mu)
        for party, g in zip(lone, gradients, strict=True):
            party.set_lr_factor(factor)
            party.apply_gradient(g, fresh=fresh, mu=mu)
    for model, party in zip(models, lone, strict=True):
        for a, b in zip(model.parameters(), party.model.parameters(), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
        assert not torch.equal(party.anchor[0], next(party.model.parameters()).detach())


def test_party_widths_that_differ_from_the_party_models_are_refused():
    from vfl_lightning.algorithms import SyncVFL
    from vfl_lightning.mechanisms.plain import Plain
    from vfl_lightning.models import LinearHead, MLPEncoder

    parties = [MLPEncoder((3,), embedding_dim=2, hidden=[]) for _ in range(2)]
    with pytest.raises(ValueError, match=r"^party_widths=\[2, 5\] differ from the party models'"):
        SyncVFL(
            parties,
            LinearHead(4, 2),
            Plain(2),
            lambda params: torch.optim.SGD(params, lr=0.1),
            2,
            party_widths=[2, 5],
        )
