"""Cascaded hybrid optimization: the two-point estimator, the wire (no gradient reaches a ZOO
client), the staleness table, learning (cascade beats zoo_vfl) and bad inputs."""

from functools import partial

import lightning as L
import pytest
import torch
from conftest import resume_against_straight
from hydra.utils import instantiate

from vfl_lightning.algorithms import HybridVFL
from vfl_lightning.algorithms.zoo import (
    client_query,
    double_parameters,
    evaluate_at,
    flat_parameters,
    sample_directions,
    two_point_estimate,
    unflatten_parameters,
)
from vfl_lightning.mechanisms import Plain
from vfl_lightning.models import LinearHead, MLPEncoder
from vfl_lightning.train import build, train

MU = 0.001


@pytest.mark.parametrize("direction", ["gaussian", "sphere"])
def test_two_point_estimator_is_unbiased_for_a_quadratic_at_default_mu(direction):
    gen = torch.Generator().manual_seed(3)
    d, n = 6, 200_000
    root = torch.randn(d, d, generator=gen, dtype=torch.float64)
    a = root @ root.T / d + torch.eye(d, dtype=torch.float64)
    b = torch.randn(d, generator=gen, dtype=torch.float64)
    x = torch.randn(d, generator=gen, dtype=torch.float64)

    def f(z):
        return 0.5 * ((z @ a) * z).sum(-1) + z @ b

    true_gradient = a @ x + b
    u = sample_directions(n, (d,), direction=direction, generator=gen)
    if direction == "sphere":
        assert torch.allclose(u.norm(dim=1), torch.ones(n, dtype=torch.float64))
    perturbed = f(x + MU * u)
    estimate = two_point_estimate(f(x), perturbed, u, mu=MU, direction=direction)
    phi = 1.0 if direction == "gaussian" else float(d)
    samples = (phi / MU) * (perturbed - f(x))[:, None] * u
    assert torch.allclose(estimate, samples.mean(0))
    standard_error = samples.std(0) / n**0.5
    assert ((estimate - true_gradient).abs() <= 5 * standard_error).all(), (
        estimate,
        true_gradient,
    )
    # the bound is tight enough to see a wrong phi(d): half the estimate is far outside it
    assert ((estimate / 2 - true_gradient).abs() > 5 * standard_error).any()


def _module(**options) -> HybridVFL:
    torch.manual_seed(0)
    parties = [MLPEncoder((3,), embedding_dim=4, hidden=[]) for _ in range(2)]
    return HybridVFL(
        parties,
        LinearHead(8, 3),
        Plain(2, fusion="concat"),
        partial(torch.optim.SGD, lr=0.01),
        num_classes=3,
        **options,
    )


@pytest.mark.parametrize("zoo_space", ["params", "output"])
def test_client_query_estimates_the_true_gradient_at_default_mu(zoo_space):
    """The protocol's own query (client outputs, server losses from the same head, float64)
    averages to the autograd gradient of the batch loss."""
    n = 4000
    module = _module(num_directions=n, zoo_space=zoo_space)
    gen = torch.Generator().manual_seed(5)
    xs = [torch.randn(5, 3, generator=gen) for _ in range(2)]
    y = torch.tensor([0, 1, 2, 1, 0])
    columns = [party(x).detach() for party, x in zip(module.parties, xs)]
    query = client_query(module.parties[0], xs[0], module.zoo_settings, gen)
    head = unflatten_parameters(module.head, flat_parameters(module.head))
    losses = module.query_losses(columns, 0, (query.embedding, query.perturbed), y, head)
    samples = (1 / MU) * (losses[1:] - losses[0]).reshape(n, *[1] * (query.directions.dim() - 1))
    samples = samples * query.directions

    party = module.parties[0]
    w = flat_parameters(party).requires_grad_()
    c = torch.func.functional_call(party, unflatten_parameters(party, w), (xs[0].double(),))
    if zoo_space == "output":
        c = c.detach().requires_grad_()
    inputs = [c, columns[1].double()]
    logits = torch.func.functional_call(module.head, head, (torch.cat(inputs, -1),))
    loss = torch.nn.functional.cross_entropy(logits, y)
    true_gradient = torch.autograd.grad(loss, w if zoo_space == "params" else c)[0]
    standard_error = samples.std(0) / n**0.5
    assert ((samples.mean(0) - true_gradient).abs() <= 5 * standard_error + 1e-12).all()


def _transcript(make_cfg, algo, *extra):
    cfg = make_cfg(f"algo={algo}", "debug=limit", "algo.transcript_size=100000", *extra)
    L.seed_everything(0)
    datamodule, module = build(cfg)
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[])
    trainer.fit(module, datamodule=datamodule)
    return trainer, module


@pytest.mark.parametrize("algo,space", [("cascade", "params"), ("zoo_vfl", "output")])
def test_no_gradient_ever_reaches_a_zoo_client(make_cfg, algo, space):
    trainer, module = _transcript(
        make_cfg, algo, f"algo.zoo_space={space}", "algo.num_directions=2"
    )
    transcript = list(module.wire.ledger.transcript)
    down = [e for e in transcript if e.direction == "down"]
    up = [e for e in transcript if e.direction == "up" and e.kind != "initial_embedding"]
    # algo.epoch=client_pass: 2 epochs x 3 batches, each through all 4 clients
    iterations = 2 * 3 * 4
    assert len(down) == trainer.global_step == module.wire.ledger.rounds == iterations
    assert {e.kind for e in down} == {"loss"}
    assert all(e.shape == (3,) and e.bits == 3 * 64 for e in down)
    # every client answered once per batch
    assert sorted(e.party for e in down[:4]) == [0, 1, 2, 3]
    # uplink: c and two c_hat per iteration, float64
    assert [e.kind for e in up[:3]] == ["embedding", "perturbed_embedding", "perturbed_embedding"]
    assert len(up) == 3 * trainer.global_step
    assert all(e.bits == 64 * e.shape[0] * e.shape[1] for e in up)
    assert sum(module.wire.ledger.bits["down"]) == iterations * 3 * 64


def test_first_order_async_sends_gradients(make_cfg):
    """The same transcript check on vafl sees gradients: the check above can fail."""
    trainer, module = _transcript(make_cfg, "vafl")
    down = [e for e in module.wire.ledger.transcript if e.direction == "down"]
    assert {e.kind for e in down} == {"gradient"} and len(down) == trainer.global_step


class _Snapshots(L.Callback):
    def __init__(self):
        self.initial = None
        self.steps = []

    def on_train_start(self, trainer, module):
        self.initial = [{k: v.clone() for k, v in p.state_dict().items()} for p in module.parties]

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        states = [{k: v.clone() for k, v in p.state_dict().items()} for p in module.parties]
        head = {k: v.clone() for k, v in module.head.state_dict().items()}
        self.steps.append((batch[2].clone(), states, head, batch[1].clone()))


@pytest.mark.parametrize("algo", ["cascade", pytest.param("vafl", marks=pytest.mark.slow)])
def test_table_holds_the_right_version_after_a_scripted_activation_order(make_cfg, algo):
    order = [0, 2, 1, 1, 3, 0, 2]
    cfg = make_cfg(
        f"algo={algo}",
        f"algo.activation_order=[{','.join(map(str, order))}]",
        "algo.epoch=server_iterations",
        "trainer.max_steps=9",
        "trainer.limit_val_batches=0",
        "data.batch_size=64",
    )
    L.seed_everything(0)
    datamodule, module = build(cfg)
    snapshots = _Snapshots()
    trainer = instantiate(
        cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[snapshots]
    )
    trainer.fit(module, datamodule=datamodule)
    assert trainer.global_step == 9

    xs = datamodule.splits["train"].xs
    probe = instantiate(cfg.party)(input_shape=datamodule.party_shapes[0])
    n = len(datamodule.splits["train"])

    def embed(m, state, rows):
        probe.load_state_dict(state[m] if isinstance(state, list) else state)
        with torch.no_grad():
            return probe(xs[m][rows])

    everything = torch.arange(n)
    expected = [embed(m, snapshots.initial, everything) for m in range(4)]
    written_at = torch.zeros(n, 4, dtype=torch.long)
    for t, (idx, states, _, _) in enumerate(snapshots.steps):
        m = order[t % len(order)]
        expected[m][idx] = embed(m, states, idx)
        written_at[idx, m] = t
    table = module.table
    assert torch.equal(table.written_at, written_at)
    for m in range(4):
        assert torch.allclose(table.columns[m], expected[m], atol=1e-5), m
    last_idx = snapshots.steps[-1][0]
    assert torch.equal(module.last_ages, 8 - written_at[last_idx])
    assert module.last_ages.max() == 8 and (module.last_ages[:, order[8 % 7]] == 0).all()
    if algo == "cascade":
        # the losses the client got came from the head BEFORE the server's step of that iteration
        _, _, head_before, y = snapshots.steps[-1]
        fused = torch.cat([column[last_idx] for column in table.columns], -1)

        def loss_with(state):
            return torch.nn.functional.cross_entropy(
                torch.func.functional_call(module.head, state, (fused,)), y
            )

        client = order[8 % 7]
        assert module.wire.exchanged_round[client] == 8
        seen = {m.kind: m.payload for m in module.wire.exchanged[client] if m.direction == "down"}
        h = seen["loss"][0]
        assert abs(h - loss_with(head_before)) < 1e-5
        assert abs(h - loss_with(dict(module.head.named_parameters()))) > 1e-4


def test_cascade_beats_zoo_vfl_on_digits_after_the_same_epochs(make_cfg):
    accuracy = {}
    for algo in ("cascade", "zoo_vfl"):
        cfg = make_cfg(f"algo={algo}", "trainer.max_epochs=1", "callbacks.checkpoint=null")
        accuracy[algo] = train(cfg)["val/acc"]
    assert accuracy["cascade"] >= 0.4, accuracy
    assert accuracy["cascade"] > accuracy["zoo_vfl"] + 0.25, accuracy


@pytest.mark.parametrize(
    "options,message",
    [
        ({"mu": 0.0}, r"mu must be > 0, got 0.0"),
        ({"mu": -0.001}, r"mu must be > 0, got -0.001"),
        ({"num_directions": 0}, r"num_directions must be an integer >= 1, got 0"),
        ({"direction": "cube"}, r"direction must be one of \('gaussian', 'sphere'\), got 'cube'"),
        ({"zoo_space": "logits"}, r"zoo_space must be one of \('params', 'output'\)"),
        ({"client_speeds": [1.0, 2.0, 3.0]}, r"one speed per client \(2 clients\), got 3 values"),
        ({"client_speeds": [1.0, 0.0]}, r"client_speeds must all be > 0, got \[1.0, 0.0\]"),
        ({"client_speeds": [1.0, -2.0]}, r"client_speeds must all be > 0, got \[1.0, -2.0\]"),
        ({"activation_order": [0, 2]}, r"activation_order must be .* in \[0, 1\], got \[0, 2\]"),
        ({"client_update": "foo", "server_update": "zoo"}, r"needs server_update='foo'"),
        ({"epoch": "batches"}, r"algo.epoch must be one of \('client_pass', 'server_iterations'\)"),
        ({"max_staleness": -1}, r"algo.max_staleness must be an integer >= 0 .* got -1"),
        ({"max_staleness": 2.5}, r"algo.max_staleness must be an integer >= 0 .* got 2.5"),
        ({"server_lr": 0}, r"^algo.server_lr must be a finite number > 0 or null, got 0$"),
        ({"server_lr": "x"}, r"^algo.server_lr must be a finite number > 0 or null, got 'x'$"),
        ({"max_simulated_s": 0}, r"^algo.max_simulated_s must be > 0 or null, got 0$"),
        (
            {"activation_order": [0, 0, 1]},
            r"every client exactly once with algo.epoch=client_pass .* got \[0, 0, 1\]",
        ),
    ],
)
def test_bad_options_raise_clear_errors(options, message):
    with pytest.raises(ValueError, match=message):
        _module(**options)


def test_client_speeds_set_the_activation_frequencies():
    module = _module(client_speeds=[1.0, 3.0])
    draws = torch.tensor([module.activation.next() for _ in range(4000)])
    share = (draws == 1).double().mean()
    assert abs(share - 0.75) < 4 * (0.75 * 0.25 / 4000) ** 0.5


def test_client_passes_are_permutations_ordered_by_speed():
    module = _module(client_speeds=[1.0, 3.0])
    passes = [module.activation.next_pass() for _ in range(4000)]
    assert all(sorted(p) == [0, 1] for p in passes)
    share = sum(p[0] == 1 for p in passes) / 4000
    assert abs(share - 0.75) < 4 * (0.75 * 0.25 / 4000) ** 0.5


class _Ages(L.Callback):
    def __init__(self):
        self.max_ages = []

    def on_train_batch_end(self, trainer, module, *args):
        self.max_ages.append(int(module.last_ages.max()))


@pytest.mark.parametrize("bound", [None, 6])
def test_max_staleness_bounds_the_ages_and_charges_refreshes_on_the_wire(make_cfg, bound):
    overrides = [
        "algo=cascade",
        "algo.epoch=server_iterations",
        "algo.transcript_size=100000",
        "trainer.max_steps=30",
        "trainer.limit_val_batches=0",
    ]
    if bound is not None:
        overrides.append(f"algo.max_staleness={bound}")
    cfg = make_cfg(*overrides)
    L.seed_everything(0)
    datamodule, module = build(cfg)
    ages = _Ages()
    trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[ages])
    trainer.fit(module, datamodule=datamodule)
    refreshed = [e for e in module.wire.ledger.transcript if e.kind == "refreshed_embedding"]
    if bound is None:
        assert max(ages.max_ages) > 6 and module.refreshes == 0 and not refreshed
        return
    assert max(ages.max_ages) <= bound
    assert module.refreshes == sum(e.shape[0] for e in refreshed) > 0
    assert all(e.direction == "up" and e.bits == 32 * e.shape[0] * e.shape[1] for e in refreshed)


def test_resume_two_plus_two_epochs_equals_four_with_table_and_activations(make_cfg):
    common = [
        "algo=cascade",
        "algo.max_staleness=12",
        "trainer.limit_train_batches=5",
        "trainer.limit_val_batches=1",
        "test=false",
    ]
    a, b, results = resume_against_straight(make_cfg, common, epochs=4, first=2)
    # client passes: 4 epochs x 5 batches x 4 clients
    assert a["async"]["activation"]["position"] == b["async"]["activation"]["position"] == 80
    assert a["async"]["refreshes"] == b["async"]["refreshes"] == results["async/refreshes"] > 0
    assert torch.equal(a["async"]["table"]["written_at"], b["async"]["table"]["written_at"])
    for col_a, col_b in zip(a["async"]["table"]["columns"], b["async"]["table"]["columns"]):
        assert torch.equal(col_a, col_b)


def test_server_lr_sets_the_head_step_alone(make_cfg):
    """algo.server_lr: one first-order server iteration moves the head twice as far at twice the
    server lr, and the client's step (from the same dL/dc, computed before the server's update)
    is bit-identical; null keeps the clients' lr for the head."""

    def first_step(*extra):
        cfg = make_cfg(
            "experiment=cascade_digits",
            "algo=vafl",
            "algo.epoch=server_iterations",
            "trainer.max_steps=1",
            *extra,
        )
        L.seed_everything(0)
        datamodule, module = build(cfg)
        head_before = [p.detach().clone() for p in module.head.parameters()]
        trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[])
        trainer.fit(module, datamodule=datamodule)
        parties, server = module.split_optimizers()
        lrs = {g["lr"] for o in parties for g in o.optimizer.param_groups}
        moved = [a - b for a, b in zip(module.head.parameters(), head_before, strict=True)]
        party_state = [p.detach().clone() for p in module.parties.parameters()]
        return lrs, server.optimizer.param_groups[0]["lr"], moved, party_state

    lrs, server_lr, moved, parties = first_step()
    assert lrs == {0.02} and server_lr == 0.02
    lrs2, server_lr2, moved2, parties2 = first_step("algo.server_lr=0.04")
    assert lrs2 == {0.02} and server_lr2 == 0.04
    assert any(m.abs().max() > 0 for m in moved)
    for a, b in zip(moved, moved2, strict=True):
        torch.testing.assert_close(b, 2 * a, rtol=1e-4, atol=1e-7)
    for a, b in zip(parties, parties2, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algo", ["vafl", "npq"])
def test_max_simulated_s_stops_a_run_on_the_clock(make_cfg, algo):
    """algo.max_simulated_s (every protocol; the FedVS family's own tests cover it there) ends a
    vafl or npq run under FedVS's stragglers at the first step that reaches it, long before the
    epoch's end."""
    experiment = ["experiment=cascade_digits"] if algo == "vafl" else []
    cfg = make_cfg(
        *experiment,
        f"algo={algo}",
        "+algo.max_simulated_s=5" if algo == "npq" else "algo.max_simulated_s=5",
        "network=fedvs",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=1",
        "test=false",
        "callbacks.checkpoint=null",
    )
    L.seed_everything(0)
    datamodule, module = build(cfg)
    times = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            times.append(pl_module.wire.clock.now)

    trainer = instantiate(
        cfg.trainer, logger=False, enable_checkpointing=False, callbacks=[Clock()]
    )
    trainer.fit(module, datamodule=datamodule)
    assert times[-1] >= 5.0 and all(t < 5.0 for t in times[:-1])
    assert len(times) < len(datamodule.train_dataloader())


def test_a_query_leaves_the_heads_batch_norm_statistics_alone():
    """double_parameters copies the running statistics too: a float64 query through a
    batch-norm head neither fails on the float32 buffers nor moves them."""
    head = torch.nn.Sequential(torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 3)).train()
    before = head[0].running_mean.clone()
    x = torch.randn(2, 5, 4, dtype=torch.float64)
    logits = evaluate_at(head, double_parameters(head), x[0])
    assert logits.dtype == torch.float64 and torch.equal(head[0].running_mean, before)


def test_split_resnet_body_scores_stacked_candidates_as_separate_batches():
    """head=resnet18_body on a query's stacked candidates (K, B, F) gives each candidate the
    logits (batch statistics included) it gets alone."""
    from vfl_lightning.models import ResNet18Body

    torch.manual_seed(0)
    body = ResNet18Body(8 * 8 * 8, 3, channels=8, height=8).train()
    stacked = torch.randn(2, 4, 8 * 8 * 8)
    with torch.no_grad():
        together = body(stacked)
        alone = torch.stack([body(stacked[0]), body(stacked[1])])
    assert together.shape == (2, 4, 3)
    assert torch.equal(together, alone)
