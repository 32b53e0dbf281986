"""The fast paths keep results: grouped parties vs the per-party loop, one foreach step vs M
optimizer steps, and per-epoch logging that stays complete with per-step logs thinned."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from conftest import fit
from lightning.pytorch.loggers import Logger

from vfl_lightning.algorithms.zoo import (
    double_parameters,
    evaluate_at,
    evaluation_parameters,
    flat_parameters,
    perturbed_outputs,
    unflatten_parameters,
)
from vfl_lightning.models import CNNEncoder, LinearHead, MLPEncoder, MLPHead
from vfl_lightning.models.batched import GroupedParties, groupable, linear_chain
from vfl_lightning.models.pn import PolynomialNetwork
from vfl_lightning.optim import step_together, zero_together


def _parties(count, shape=(7,), **kwargs):
    torch.manual_seed(0)
    return [MLPEncoder(shape, **kwargs) for _ in range(count)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"hidden": [64], "output_activation": "tanh"},
        {"hidden": [], "bias": False},
        {"hidden": [16, 8], "activation": "sigmoid"},
    ],
)
def test_grouped_parties_match_the_loop(kwargs):
    """Forward values and every party's parameter gradients agree with the loop. Tolerance
    1e-6 (float32): a batched GEMM may add the products in another order than M single GEMMs;
    on the CPU builds measured the two are bit-identical."""
    loop = _parties(5, (2, 3), **kwargs)
    grouped = copy.deepcopy(loop)
    xs = [torch.randn(9, 2, 3, generator=torch.Generator().manual_seed(m)) for m in range(5)]
    gs = [torch.randn(9, 16, generator=torch.Generator().manual_seed(9 + m)) for m in range(5)]
    expected = [p(x) for p, x in zip(loop, xs, strict=True)]
    torch.autograd.backward(expected, gs)
    group = GroupedParties(grouped)
    stacked = group(xs)
    assert stacked.shape == (5, 9, 16)
    torch.autograd.backward(stacked, torch.stack(gs))
    assert all(p.grad is None for p in grouped[0].parameters())  # on the stacks until handed out
    group.distribute_gradients()
    for h, e in zip(stacked.unbind(0), expected, strict=True):
        torch.testing.assert_close(h, e, rtol=1e-6, atol=1e-6)
    for a, b in zip(loop, grouped, strict=True):
        for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
            torch.testing.assert_close(pb.grad, pa.grad, rtol=1e-6, atol=1e-6, msg=name)


def test_only_homogeneous_fully_connected_parties_are_grouped():
    assert groupable(_parties(3))
    assert not groupable(_parties(1))
    assert not groupable([*_parties(2, (7,)), *_parties(1, (8,))])  # uneven input widths
    assert not groupable([*_parties(2, hidden=[4]), *_parties(1, hidden=[5])])
    assert not groupable([CNNEncoder((1, 4, 4)), CNNEncoder((1, 4, 4))])
    with pytest.raises(ValueError, match=r"MLPEncoder \(or PolynomialNetwork\) parties of one"):
        GroupedParties([CNNEncoder((1, 4, 4)), CNNEncoder((1, 4, 4))])
    polynomials = [PolynomialNetwork((8,), embedding_dim=4, num_layers=2) for _ in range(3)]
    assert groupable(polynomials)
    assert not groupable([*polynomials, PolynomialNetwork((8,), embedding_dim=4, num_layers=3)])
    assert not groupable([*polynomials, PolynomialNetwork((9,), embedding_dim=4, num_layers=2)])
    assert not groupable([*polynomials[:1], *_parties(1, (8,))])


def test_grouped_polynomial_networks_match_the_loop():
    """FedVS's polynomial-network clients as one grouped computation: the same embeddings and
    weight gradients as each client's own forward and backward (tolerance as above; on the CPU
    builds measured the two are bit-identical), each client keeping its own parameter."""
    torch.manual_seed(0)
    loop = [PolynomialNetwork((2, 4), embedding_dim=5, num_layers=3) for _ in range(4)]
    grouped = copy.deepcopy(loop)
    xs = [torch.randn(6, 2, 4, generator=torch.Generator().manual_seed(m)) for m in range(4)]
    gs = [torch.randn(6, 5, generator=torch.Generator().manual_seed(7 + m)) for m in range(4)]
    expected = [p(x) for p, x in zip(loop, xs, strict=True)]
    torch.autograd.backward(expected, gs)
    group = GroupedParties(grouped)
    stacked = group(xs)
    torch.autograd.backward(stacked, torch.stack(gs))
    group.distribute_gradients()
    for h, e, a, b in zip(stacked.unbind(0), expected, loop, grouped, strict=True):
        torch.testing.assert_close(h, e, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(b.weight.grad, a.weight.grad, rtol=1e-6, atol=1e-6)
        assert b.weight.shape == a.weight.shape and isinstance(b.weight, torch.nn.Parameter)


@pytest.mark.parametrize(
    "model",
    [
        MLPEncoder((2, 3), embedding_dim=5, hidden=[4], output_activation="tanh"),
        MLPEncoder((6,), embedding_dim=5, hidden=[], bias=False),
        MLPHead(6, 3, hidden=[8, 4]),
        LinearHead(6, 3),
        CNNEncoder((1, 4, 4), embedding_dim=5),
    ],
    ids=["mlp", "linear-party", "mlp-head", "linear-head", "cnn"],
)
def test_zoo_queries_without_vmap_equal_functional_call(model):
    """The K perturbed evaluations of a zeroth-order query (one batched product per layer for
    fully connected models) and the server's evaluation at float64 parameters equal
    ``torch.func.functional_call`` at each parameter set (float64, up to summation order)."""
    generator = torch.Generator().manual_seed(3)
    shape = getattr(model, "input_shape", (6,))
    x = torch.randn(7, *shape, generator=generator)
    w = flat_parameters(model)
    weights = torch.stack([w, w + 1e-3 * torch.randn(w.shape, generator=generator, dtype=w.dtype)])
    got = perturbed_outputs(model, weights, x)
    for k in range(2):
        expected = torch.func.functional_call(
            model, unflatten_parameters(model, weights[k]), (x.double(),)
        )
        torch.testing.assert_close(got[k], expected, rtol=1e-12, atol=1e-12)
    if isinstance(model, LinearHead | MLPHead):  # the server's heads: inputs (K, B, F)
        stacked_input = x.double().expand(3, *x.shape)
        expected = torch.func.functional_call(model, double_parameters(model), (stacked_input,))
        got = evaluate_at(model, double_parameters(model), stacked_input)
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
        read_from_layers = evaluate_at(model, evaluation_parameters(model), stacked_input)
        assert torch.equal(read_from_layers, got)
    assert (linear_chain(model) is None) == isinstance(model, CNNEncoder)


@pytest.mark.parametrize(
    "settings",
    [
        {"lr": 0.1},
        {"lr": 0.05, "momentum": 0.9},
        {"lr": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
        {"lr": 0.05, "momentum": 0.5, "dampening": 0.1, "maximize": True},
    ],
)
def test_one_foreach_step_is_bit_identical_to_separate_steps(settings):
    separate = _parties(4)
    together = copy.deepcopy(separate)
    opts_a = [torch.optim.SGD(p.parameters(), **settings) for p in separate]
    opts_b = [torch.optim.SGD(p.parameters(), **settings) for p in together]
    for step in range(3):
        x = torch.randn(6, 7, generator=torch.Generator().manual_seed(step))
        for opt in opts_a:
            opt.zero_grad()
        zero_together(opts_b)
        sum(p(x).square().sum() for p in separate).backward()
        sum(p(x).square().sum() for p in together).backward()
        for opt in opts_a:
            opt.step()
        assert step_together(opts_b)
    for a, b in zip(separate, together, strict=True):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
    for a, b in zip(opts_a, opts_b, strict=True):  # one optimizer state per party
        sa, sb = a.state_dict(), b.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        assert sa["state"].keys() == sb["state"].keys()
        for key in sa["state"]:
            for name, value in sa["state"][key].items():
                assert torch.equal(value, sb["state"][key][name]) if value is not None else True


def test_foreach_step_declines_mixed_optimizers():
    parties = _parties(2)
    for p in parties:
        p(torch.randn(3, 7)).sum().backward()
    before = [q.detach().clone() for p in parties for q in p.parameters()]
    assert not step_together([torch.optim.Adam(parties[0].parameters())] * 2)
    assert not step_together(
        [
            torch.optim.SGD(parties[0].parameters(), lr=0.1),
            torch.optim.SGD(parties[1].parameters(), lr=0.2),
        ]
    )
    after = [q.detach() for p in parties for q in p.parameters()]
    assert all(torch.equal(a, b) for a, b in zip(before, after, strict=True))


def test_grouped_training_equals_the_loop(make_cfg):
    """npq on digits (4 homogeneous parties, momentum SGD): the grouped path with one foreach
    party step ends where the per-party loop ends (float tolerance 1e-5, see above)."""
    common = ("algo=npq", "trainer.max_epochs=1", "trainer.limit_train_batches=15")
    _, grouped, _ = fit(make_cfg(*common))
    _, loop, _ = fit(make_cfg(*common, "+algo.batch_parties=false"))
    assert grouped.party_side.grouped is not None and loop.party_side.grouped is None
    for a, b in zip(grouped.parameters(), loop.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


class RecordingLogger(Logger):
    """Keeps every ``log_metrics`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict]] = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return 0

    def log_hyperparams(self, params, *args, **kwargs):
        return None

    def log_metrics(self, metrics, step=None):
        self.rows.append((step, dict(metrics)))


@pytest.mark.parametrize("algo", ["pbm", "cascade"])
def test_epoch_logs_are_complete_and_step_logs_follow_log_every_n_steps(make_cfg, algo):
    """Every epoch logs train/loss_epoch (the batch-size-weighted mean of the step losses),
    train/acc, the mechanism / protocol aggregates and the communication totals; train/loss is
    written every ``log_every_n_steps`` batches, as Lightning writes step metrics."""
    import lightning as L
    from hydra.utils import instantiate

    from vfl_lightning.train import build

    extra = ["experiment=cascade_digits"] if algo == "cascade" else [f"algo={algo}"]
    cfg = make_cfg(*extra, "trainer.max_epochs=2", "trainer.log_every_n_steps=7")
    L.seed_everything(cfg.seed, workers=True)
    datamodule, module = build(cfg)
    losses: list[tuple[float, int]] = []
    protocol_step = module.protocol_step

    def recorded(xs, y, *rest):
        loss, logits = protocol_step(xs, y, *rest)
        losses.append((float(loss.detach()), int(y.shape[0])))
        return loss, logits

    module.protocol_step = recorded
    logger = RecordingLogger()
    trainer = instantiate(cfg.trainer, logger=logger, enable_checkpointing=False, callbacks=[])
    trainer.fit(module, datamodule=datamodule)
    batches = trainer.num_training_batches
    epoch_rows = [m for _, m in logger.rows if "train/loss_epoch" in m]
    assert len(epoch_rows) == 2
    expected_keys = {"train/loss_epoch", "train/acc", "comm/uplink_mb", "comm/rounds", "epoch"}
    expected_keys |= (
        {"pbm/clip_fraction"} if algo == "pbm" else {"async/staleness_mean", "async/staleness_max"}
    )
    for epoch, row in enumerate(epoch_rows):
        assert expected_keys <= row.keys()
        chunk = losses[epoch * batches : (epoch + 1) * batches]
        mean = sum(v * n for v, n in chunk) / sum(n for _, n in chunk)
        assert row["train/loss_epoch"] == pytest.approx(mean, rel=1e-5)
        assert 0.0 <= row["train/acc"] <= 1.0
    step_rows = [(s, m) for s, m in logger.rows if "train/loss" in m]
    assert [s for s, _ in step_rows] == [s for s in range(2 * batches) if (s + 1) % 7 == 0]
    for step, row in step_rows:
        assert row["train/loss"] == pytest.approx(losses[step][0], rel=1e-6)


@pytest.mark.parametrize("num_parties,bits", [(2, 7), (6, 9), (28, 62)])
def test_pair_masks_come_from_each_pairs_stream_key(num_parties, bits):
    """The vectorized key derivation gives the masks the per-pair keys define: word c of pair k is
    splitmix64(key_k + (c+1)γ), cut into ⌊64 / bits⌋ fields of ``bits`` bits, low bits first."""
    from vfl_lightning.mechanisms.secure_agg import PairwiseMasking
    from vfl_lightning.seeding import GOLDEN_GAMMA, as_int64, splitmix64_int

    masking = PairwiseMasking(num_parties, bits, seed=11)
    numel, per_word = 23, 64 // bits
    for round in (0, 3, 2**40 + 1):
        masks = masking.pair_masks(round, numel)
        for pair, key in enumerate(masking.stream_keys(round)):
            expected = []
            for word in range(-(-numel // per_word)):
                value = splitmix64_int((key + (word + 1) * GOLDEN_GAMMA) & ((1 << 64) - 1))
                expected += [(value >> (f * bits)) & ((1 << bits) - 1) for f in range(per_word)]
            assert masks[pair].tolist() == [as_int64(v) for v in expected[:numel]]


def test_accumulate_epoch_rejects_unknown_reduction(make_cfg):
    from vfl_lightning.train import build

    _, module = build(make_cfg("algo=npq"))
    with pytest.raises(ValueError, match="reduce must be 'mean' or 'max', got 'sum'"):
        module.accumulate_epoch("x", 1.0, reduce="sum")


class CountsServerSteps(L.Callback):
    """Overrides a server hook, so the module must take Lightning's route (and call it)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self.calls += 1


@pytest.mark.parametrize("algo", ["npq", "fedbcd"])
def test_plain_server_steps_equal_lightnings_route_bit_for_bit(make_cfg, algo):
    """The server's backward and step without Lightning's dispatch give the same parameters and
    global_step as ``manual_backward`` + ``LightningOptimizer.step``; a callback that overrides a
    server hook switches the module to Lightning's route, and the hook runs at every update."""
    from hydra.utils import instantiate

    from vfl_lightning.train import build

    cfg = make_cfg(f"algo={algo}", "trainer.max_epochs=1", "trainer.limit_train_batches=6")
    finals, steps, routes = [], [], []
    for callbacks in ([], [CountsServerSteps()]):
        L.seed_everything(cfg.seed, workers=True)
        datamodule, module = build(cfg)
        trainer = instantiate(
            cfg.trainer, logger=False, enable_checkpointing=False, callbacks=callbacks
        )
        trainer.fit(module, datamodule=datamodule)
        finals.append([p.detach().clone() for p in module.parameters()])
        steps.append(trainer.global_step)
        routes.append(module._plain_server_steps)
    assert routes == [True, False]
    assert steps[0] == steps[1] > 0
    assert callbacks[0].calls == steps[1]
    for a, b in zip(*finals, strict=True):
        assert torch.equal(a, b)


def test_lightning_speedups_switch_gives_the_same_parameters(make_cfg):
    """``lightning_speedups=false`` runs Lightning's own functions (the fast paths are taken out),
    ``true`` puts them in; the two runs end with bit-identical parameters and logged metrics."""
    import lightning.pytorch.trainer.connectors.logger_connector.result as result

    from vfl_lightning.train import train

    digests, fast, metrics = [], [], []
    for enabled in (False, True):
        cfg = make_cfg("algo=pbm", "trainer.max_epochs=2", f"lightning_speedups={enabled}")
        results = train(cfg)
        digests.append(results["model_digest"])
        metrics.append((results["train/loss_epoch"], results["val/acc"]))
        fast.append(getattr(result._ResultMetric.to, "_vfl_fast_path", False))
    assert fast == [False, True]
    assert digests[0] == digests[1]
    assert metrics[0] == metrics[1]


def test_result_metric_same_device_fast_path_keeps_lightnings_values(monkeypatch):
    """``self.log`` on a metric already on the value's device skips Lightning's rebuild of the
    metric's ``__dict__`` (``lightning_speedups``), and the logged means stay Lightning's; a move
    to another device still takes Lightning's own code and moves every state tensor."""
    import lightning.pytorch.trainer.connectors.logger_connector.result as result

    from vfl_lightning import lightning_speedups

    assert lightning_speedups.use(True)
    assert getattr(result._ResultMetric.to, "_vfl_fast_path", False)
    walks = []
    original_apply = result.apply_to_collection
    monkeypatch.setattr(
        result, "apply_to_collection", lambda *a, **k: walks.append(1) or original_apply(*a, **k)
    )
    collection = result._ResultCollection(True)
    values, sizes = [0.5, 2.0, -1.0], [3, 1, 4]
    for value, size in zip(values, sizes, strict=True):
        collection.log(
            "training_step", "a", torch.tensor(value), on_step=False, on_epoch=True, batch_size=size
        )
    metric = collection["training_step.a"]
    expected = sum(v * n for v, n in zip(values, sizes, strict=True)) / sum(sizes)
    assert metric.compute().item() == pytest.approx(expected, rel=1e-7)
    assert len(walks) == 0  # never walked: created on the CPU, every value on the CPU
    metric.to(torch.float64)  # not a device: Lightning's code
    assert len(walks) == 1
    metric.to(torch.device("meta"))
    assert len(walks) == 2
    assert metric.value.device.type == "meta"
    assert all(d.device.type == "meta" for d in metric._defaults.values())


def test_memoized_hook_signature_check_answers_as_lightning():
    """The training loop's ``batch_idx`` question is answered from a cache keyed by the function,
    with Lightning's answers, for methods, functions, decorated functions and other callables."""
    import functools

    from lightning.pytorch.loops import training_epoch_loop
    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature

    from vfl_lightning.lightning_speedups import memoized_signature_check, use

    assert use(True)

    assert getattr(training_epoch_loop.is_param_in_hook_signature, "_vfl_fast_path", False)

    def decorated(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            return fn(*args, **kwargs)

        return wrapper

    class Steps:
        def with_idx(self, batch, batch_idx):
            return batch

        def without(self, batch):
            return batch

        def star(self, *args):
            return args

        @decorated
        def wrapped(self, batch):
            return batch

        def __call__(self, batch, other):
            return batch

    steps = Steps()
    calls = []

    def counting(*args):
        calls.append(args)
        return is_param_in_hook_signature(*args)

    check = memoized_signature_check(counting)
    hooks = [steps.with_idx, steps.without, steps.star, steps.wrapped, steps]
    hooks += [functools.partial(Steps.with_idx, steps), lambda batch, batch_idx: batch]
    for hook in hooks:
        for question in [("batch_idx", False, 2), ("batch_idx", True, None), ("x", False, None)]:
            answer = is_param_in_hook_signature(hook, *question)
            assert check(hook, *question) == answer
            assert check(hook, *question) == answer
    # functions and methods were asked once per question, other callables every time
    assert len(calls) == 3 * (5 + 2 * 2)


def test_lightnings_hook_name_bookkeeping_skips_the_module_attribute_checks(make_cfg):
    """``_current_fx_name`` is set as a plain attribute; anything else still goes through
    ``nn.Module.__setattr__`` (a module assigned later is registered as a submodule)."""
    from vfl_lightning.train import build

    _, module = build(make_cfg("algo=npq"))
    module._current_fx_name = "training_step"
    assert module.__dict__["_current_fx_name"] == "training_step"
    module._current_fx_name = None
    assert module._current_fx_name is None
    module.extra = torch.nn.Linear(2, 2)
    assert "extra" in module._modules and "extra" not in module.__dict__


def _reference_and_grouped(count=4, momentum=0.9, weight_decay=0.0):
    """Two copies of ``count`` parties with one SGD optimizer each: the first to step party by
    party, the second with the stacked step."""
    reference = _parties(count, (6,), hidden=[5], output_activation="tanh")
    grouped = copy.deepcopy(reference)

    def optimizers(parties):
        return [
            torch.optim.SGD(p.parameters(), lr=0.1, momentum=momentum, weight_decay=weight_decay)
            for p in parties
        ]

    return reference, optimizers(reference), grouped, optimizers(grouped)


def _train_steps(group, opts, steps, *, stacked, seed=0):
    """``steps`` grouped forward/backward passes on random data; the stacked step, or each
    party's own optimizer ``step()`` on its slice of the stacked gradient."""
    for step in range(steps):
        gen = torch.Generator().manual_seed(seed + step)
        xs = [torch.randn(8, 6, generator=gen) for _ in opts]
        gs = torch.randn(len(opts), 8, 16, generator=gen)
        zero_together(opts)
        group.zero_grad()
        torch.autograd.backward(group(xs), gs)
        if stacked:
            assert group.step(opts)
        else:
            group.distribute_gradients()
            for opt in opts:
                opt.step()


@pytest.mark.parametrize("momentum,weight_decay", [(0.9, 0.0), (0.0, 0.01)])
def test_grouped_step_on_shared_storage_equals_separate_optimizers(momentum, weight_decay):
    """Each party's parameters are views of one stacked tensor per name; the stacked foreach
    SGD step gives every party exactly the parameters and momentum buffers its own optimizer
    would (bit for bit), and the optimizers keep one state per party."""
    reference, ref_opts, grouped, opts = _reference_and_grouped(4, momentum, weight_decay)
    ref_group, group = GroupedParties(reference), GroupedParties(grouped)
    weights = [p.net[1].weight for p in grouped]
    assert all(
        w.data_ptr() == group.stacked["net.1.weight"][m].data_ptr() for m, w in enumerate(weights)
    )
    _train_steps(ref_group, ref_opts, 3, stacked=False)
    _train_steps(group, opts, 3, stacked=True)
    for a, b, opt_a, opt_b in zip(reference, grouped, ref_opts, opts, strict=True):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
            assert torch.equal(pa.grad, pb.grad)  # the last step's gradient stays visible
            if momentum:
                assert torch.equal(
                    opt_a.state[pa]["momentum_buffer"], opt_b.state[pb]["momentum_buffer"]
                )


def test_grouped_step_after_a_state_load_and_a_dtype_move_keeps_the_reference():
    """Optimizer states replaced (as a checkpoint load does) are re-stacked before the next
    step; parameters moved to another dtype are re-stacked by the next forward."""
    reference, ref_opts, grouped, opts = _reference_and_grouped(3)
    ref_group, group = GroupedParties(reference), GroupedParties(grouped)
    _train_steps(ref_group, ref_opts, 2, stacked=False)
    _train_steps(group, opts, 2, stacked=True)
    for opt in opts:
        opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    _train_steps(ref_group, ref_opts, 2, stacked=False, seed=10)
    _train_steps(group, opts, 2, stacked=True, seed=10)
    for a, b in zip(reference, grouped, strict=True):
        for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
            assert torch.equal(pa, pb)
    for parties in (reference, grouped):
        for p in parties:
            p.double()
    xs = [torch.randn(8, 6, dtype=torch.float64) for _ in grouped]
    assert torch.equal(group(xs), ref_group(xs))
    assert group.stacked["net.1.weight"].dtype == torch.float64
    assert grouped[2].net[1].weight.data_ptr() == group.stacked["net.1.weight"][2].data_ptr()


def test_grouped_parties_fall_back_to_the_parties_own_optimizers():
    """Adam (not plain SGD), or a party gradient of its own (e.g. a proximal term): the stacked
    step declines, and the stacked gradients go to the parties (added to their own)."""
    parties = _parties(3, (6,))
    group = GroupedParties(parties)
    adams = [torch.optim.Adam(p.parameters()) for p in parties]
    xs = [torch.randn(4, 6) for _ in parties]
    torch.autograd.backward(group(xs), torch.ones(3, 4, 16))
    assert not group.step(adams)
    stacked_grad = group.stacked["net.1.weight"].grad.clone()
    sgds = [torch.optim.SGD(p.parameters(), lr=0.1) for p in parties]
    parties[1].net[1].weight.grad = torch.ones_like(parties[1].net[1].weight)
    assert not group.step(sgds)
    group.distribute_gradients()
    assert group.stacked["net.1.weight"].grad is None
    assert torch.equal(parties[0].net[1].weight.grad, stacked_grad[0])
    assert torch.equal(parties[1].net[1].weight.grad, stacked_grad[1] + 1)


class HookRecorder(L.Callback):
    """Records (hook, the module's ``_current_fx_name`` during it) for a few hooks it defines."""

    def __init__(self, calls: list) -> None:
        self.calls = calls

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.calls.append(("recorder.on_train_batch_start", module._current_fx_name, batch_idx))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.calls.append(("recorder.on_train_batch_end", module._current_fx_name, batch_idx))

    def on_validation_epoch_end(self, trainer, module):
        self.calls.append(("recorder.on_validation_epoch_end", module._current_fx_name, None))


def _recorded_fit(profiler=None) -> tuple[list, L.Trainer]:
    """A short fit of Lightning's demo model with a recording callback, a callback whose hook is
    set on the instance, and a callback without hooks of its own (the base's empty ones)."""
    from lightning.pytorch.demos.boring_classes import BoringModel

    calls: list = []
    on_instance = L.Callback()
    on_instance.on_train_batch_end = lambda trainer, module, *args: calls.append(
        ("instance.on_train_batch_end", module._current_fx_name, args[-1])
    )

    class Module(BoringModel):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            calls.append(("module.on_train_batch_end", self._current_fx_name, batch_idx))

    trainer = L.Trainer(
        max_epochs=1,
        limit_train_batches=3,
        limit_val_batches=1,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        profiler=profiler,
        callbacks=[HookRecorder(calls), L.Callback(), on_instance],
    )
    trainer.fit(Module())
    return calls, trainer


def test_hook_dispatch_fast_path_calls_what_lightning_calls():
    """With the do-nothing profiler the fast hook dispatch calls every hook a callback or the
    module defines (on its class or its instance), in Lightning's order and with the module's
    ``_current_fx_name`` Lightning sets, as Lightning's own dispatch does; with another profiler
    Lightning's dispatch runs (it profiles every callback hook, empty ones included)."""
    from lightning.pytorch.profilers import SimpleProfiler
    from lightning.pytorch.trainer import call

    from vfl_lightning import lightning_speedups

    try:
        lightning_speedups.use(False)
        expected, _ = _recorded_fit()
        assert lightning_speedups.use(True)
        assert getattr(call._call_callback_hooks, "_vfl_fast_path", False)
        got, _ = _recorded_fit()
        assert got == expected
        assert ("instance.on_train_batch_end", "on_train_batch_end", 2) in got
        assert ("module.on_train_batch_end", "on_train_batch_end", 2) in got
        profiled, trainer = _recorded_fit(SimpleProfiler())
        assert profiled == expected
        actions = trainer.profiler.recorded_durations
        assert "[Callback]Callback.on_train_batch_end" in actions  # the base's empty hook
        assert "[LightningModule]Module.on_train_batch_end" in actions
    finally:
        lightning_speedups.use(True)


def test_batch_transfer_hook_owner_is_kept_per_selector():
    """The batch-transfer hooks' owner (module or data module) is Lightning's answer, asked once
    per selector and hook."""
    from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel
    from lightning.pytorch.trainer.connectors.data_connector import _DataHookSelector

    from vfl_lightning.lightning_speedups import kept_hook_owner

    class Data(BoringDataModule):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            return batch

    asked = []
    lightnings = getattr(_DataHookSelector.get_instance, "__wrapped__", None)
    lightnings = lightnings or _DataHookSelector.get_instance

    def original(selector, hook_name):
        asked.append(hook_name)
        return lightnings(selector, hook_name)

    get_instance = kept_hook_owner(original)
    model, data = BoringModel(), Data()
    selector = _DataHookSelector(model, data)
    for _ in range(3):
        assert get_instance(selector, "on_before_batch_transfer") is data
        assert get_instance(selector, "transfer_batch_to_device") is model
    assert asked == ["on_before_batch_transfer", "transfer_batch_to_device"]
    assert get_instance(_DataHookSelector(model, None), "transfer_batch_to_device") is model


def test_lightning_enum_equality_keeps_its_answers():
    """The identity-first ``__eq__`` of Lightning's enums answers as Lightning's: a member equals
    itself and its value in any case, and no other member; hashing is unchanged."""
    from lightning.pytorch.trainer.states import RunningStage, TrainerFn

    from vfl_lightning import lightning_speedups

    assert lightning_speedups.use(True)
    stage = RunningStage.TRAINING
    assert getattr(type(stage).__eq__, "_vfl_fast_path", False)
    assert stage == RunningStage.TRAINING and stage == "TRAIN" and stage == "train"
    assert stage != RunningStage.VALIDATING and stage != TrainerFn.FITTING and stage != "fit"
    assert {stage: 1}[RunningStage.TRAINING] == 1 and hash(stage) == hash("train")
