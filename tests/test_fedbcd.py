"""FedBCD: Q = 1 is the synchronous algorithm, one exchange per Q iterations (transcript), the
proximal gradient, rounds to target, lr schedules, active party and bad inputs."""

import copy

import lightning as L
import pytest
import torch
from conftest import fit, resume_against_straight
from hydra.utils import instantiate

from vfl_lightning.algorithms import FedBCD
from vfl_lightning.algorithms.fedbcd import lr_factor, proximal_term
from vfl_lightning.callbacks import TargetTracker
from vfl_lightning.mechanisms import Plain, fuse_tensors
from vfl_lightning.models import LinearHead, MLPEncoder
from vfl_lightning.train import build

NO_VAL = ["trainer.limit_val_batches=0", "trainer.num_sanity_val_steps=0"]
ACTIVE_BC = ["data=breast_cancer", "data.num_parties=3", "data.active_party=true"]


def _state(module):
    return {k: v.clone() for k, v in module.state_dict().items()}


def _build(cfg):
    L.seed_everything(cfg.seed)
    return build(cfg)


def _fit_module(cfg, datamodule, module, callbacks=()):
    trainer = instantiate(
        cfg.trainer, logger=False, enable_checkpointing=False, callbacks=list(callbacks)
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer


@pytest.mark.parametrize("setting", [[], ACTIVE_BC], ids=["digits", "active_breast_cancer"])
def test_q1_is_step_for_step_fedsgd_and_the_synchronous_sum_algorithm(make_cfg, setting):
    states, ledgers = {}, {}
    for name, overrides in {
        "npq": ["algo=npq"],
        "fedsgd": ["algo=fedsgd"],
        "fedbcd_q1": ["algo=fedbcd", "algo.local_steps=1"],
    }.items():
        cfg = make_cfg(*overrides, *setting, "trainer.max_steps=6", *NO_VAL)
        trainer, module, _ = fit(cfg)
        assert trainer.global_step == 6 and module.wire.ledger.rounds == 6
        states[name] = _state(module)
        ledgers[name] = module.wire.ledger.state_dict()
    for name in ("fedsgd", "fedbcd_q1"):
        assert states[name].keys() == states["npq"].keys()
        for key, value in states["npq"].items():
            assert torch.equal(states[name][key], value), (name, key)
        assert ledgers[name] == ledgers["npq"]


@pytest.mark.parametrize("algo", ["fedbcd", "fedbcd_s"])
def test_one_exchange_per_q_iterations_and_no_message_in_between(make_cfg, algo):
    q, rounds = 3, 4
    cfg = make_cfg(
        f"algo={algo}",
        f"algo.local_steps={q}",
        "algo.transcript_size=1000",
        f"trainer.max_steps={q * rounds}",
        *NO_VAL,
    )
    datamodule, module = _build(cfg)
    sent, party_steps = [], []
    original_send = module.wire.send

    def recording_send(direction, party, payload, **kwargs):
        sent.append((module.trainer.global_step, direction, party))
        return original_send(direction, party, payload, **kwargs)

    original_step = module.party_side.step

    def counting_steps():  # all parties in one foreach update: one step each
        party_steps.extend(module.trainer.global_step for _ in range(module.num_parties))
        original_step()

    module.wire.send = recording_send
    module.party_side.step = counting_steps
    trainer = _fit_module(cfg, datamodule, module)

    parties = module.num_parties
    assert trainer.global_step == q * rounds
    assert module.wire.ledger.rounds == rounds
    # parallel: embeddings up and gradients down before the exchange iteration's server update;
    # sequential: gradients go down after the server's Q updates of the round.
    down_at = 0 if algo == "fedbcd" else q
    expected = [
        (r, r * q + offset, direction, m)
        for r in range(rounds)
        for offset, direction in ((0, "up"), (down_at, "down"))
        for m in range(parties)
    ]
    assert sent == [(step, d, m) for _, step, d, m in expected]
    transcript = [(e.round, e.direction, e.party) for e in module.wire.ledger.transcript]
    assert transcript == [(r, d, m) for r, _, d, m in expected]
    assert len(party_steps) == parties * q * rounds


def test_proximal_gradient_is_mu_times_theta_minus_theta_at_exchange(make_cfg):
    mu = 0.7
    common = [*ACTIVE_BC, "optimizer.momentum=0", *NO_VAL]
    cfg = make_cfg("algo=fedbcd", "algo.local_steps=1", "trainer.max_steps=1", *common)
    _, theta0 = _build(cfg)
    theta0 = _state(theta0)
    _, after_one, _ = fit(cfg)
    theta1 = _state(after_one)
    grads = {}
    for algo, weight in (("fedbcd", 0.0), ("fedpbcd", mu)):
        cfg = make_cfg(
            f"algo={algo}",
            f"algo.mu={weight}",
            "algo.local_steps=2",
            "trainer.max_steps=2",
            *common,
        )
        _, module, _ = fit(cfg)
        grads[algo] = {name: p.grad.clone() for name, p in module.named_parameters()}
    assert grads["fedbcd"].keys() == grads["fedpbcd"].keys()
    assert any(k.startswith("server_party.") for k in grads["fedbcd"])
    for name, plain in grads["fedbcd"].items():
        expected = mu * (theta1[name] - theta0[name])
        assert expected.abs().max() > 0, name
        torch.testing.assert_close(grads["fedpbcd"][name] - plain, expected, rtol=1e-4, atol=1e-7)


def test_proximal_term_autograd():
    theta = torch.randn(5, 3, requires_grad=True)
    anchor = torch.randn(5, 3)
    (grad,) = torch.autograd.grad(proximal_term([theta], [anchor], 0.3), theta)
    torch.testing.assert_close(grad, 0.3 * (theta.detach() - anchor))


def _rounds_to_auc(make_cfg, algo, q, seed, target, epochs):
    cfg = make_cfg(
        "experiment=fedbcd_breast_cancer",
        f"algo={algo}",
        f"algo.local_steps={q}",
        f"seed={seed}",
        f"trainer.max_epochs={epochs}",
    )
    datamodule, module = _build(cfg)
    tracker = TargetTracker("val/auroc", target, stop=True)
    _fit_module(cfg, datamodule, module, [tracker])
    reached = tracker.results()["rounds_to_target"]
    # A run that never reaches the target counts as one round more than it ran, fewer than it
    # would need: the comparison below is conservative.
    return module.wire.ledger.rounds + 1 if reached is None else reached


def test_q5_reaches_the_target_auc_in_at_least_half_the_rounds_of_q1(make_cfg):
    target, seeds, epochs = 0.97, (0, 1, 2), 6
    rounds = {
        q: [_rounds_to_auc(make_cfg, algo, q, s, target, epochs) for s in seeds]
        for algo, q in (("fedsgd", 1), ("fedbcd", 5))
    }
    assert max(rounds[5]) <= epochs * 7, rounds  # every Q = 5 run reached it (7 rounds / epoch)
    assert 2 * sum(rounds[5]) <= sum(rounds[1]), rounds


def test_lr_schedules_follow_the_exchange_round(make_cfg):
    assert lr_factor("constant", 7, 3) == 1.0
    assert lr_factor("sqrt_decay", 3, 3) == pytest.approx(0.5)
    assert lr_factor("sqrt_decay_k", 3, 4) == pytest.approx(0.25)
    for schedule, k_factor in (("sqrt_decay", 1), ("sqrt_decay_k", 3)):
        cfg = make_cfg(
            *ACTIVE_BC,
            "algo=fedbcd",
            "algo.local_steps=2",
            f"algo.lr_schedule={schedule}",
            "optimizer.lr=0.2",
            "trainer.max_steps=8",
            *NO_VAL,
        )
        _, module, _ = fit(cfg)
        assert module.num_feature_parties == 3
        for opt in module.trainer.optimizers:
            for group in opt.param_groups:
                # the 4th round (r = 3) ran at eta0 / sqrt((3 + 1) K)
                assert group["lr"] == pytest.approx(0.2 / (4 * k_factor) ** 0.5)


def test_active_party_gradients_are_the_centralized_ones_and_never_cross_the_wire(make_cfg):
    batch, width = 32, 4
    cfg = make_cfg(
        "algo=npq",
        *ACTIVE_BC,
        f"data.batch_size={batch}",
        "data.drop_last=true",
        f"party.embedding_dim={width}",
        "optimizer.momentum=0",
        "trainer.max_steps=1",
        *NO_VAL,
    )
    datamodule, module = _build(cfg)
    assert module.num_parties == 2 and module.server_party is not None
    assert datamodule.party_shapes == [(10,), (10,)] and datamodule.server_shape == (10,)
    central = copy.deepcopy(module)
    _fit_module(cfg, datamodule, module)

    loader = datamodule.train_dataloader()
    loader.sampler.set_epoch(0)
    xs, y, _ = next(iter(loader))
    assert len(xs) == 3
    hs = [p(x) for p, x in zip(central.parties, xs[:2])]
    fused = fuse_tensors([*hs, central.server_party(xs[2])], "sum")
    torch.nn.functional.cross_entropy(central.head(fused), y).backward()
    for (name, p_vfl), p_central in zip(module.named_parameters(), central.parameters()):
        torch.testing.assert_close(p_vfl.grad, p_central.grad, rtol=1e-5, atol=1e-7, msg=name)
    ledger = module.wire.ledger
    assert (
        ledger.bits["up"] == [batch * width * 32] * 2
    )  # two wire parties, nothing from the server
    assert ledger.bits["down"] == [batch * width * 32] * 2


def test_binary_digits_and_active_party_data():
    from sklearn.datasets import load_digits

    from vfl_lightning.data import VerticalDataModule

    dm = VerticalDataModule(
        "digits", num_parties=2, partition="halves", active_party=True, binary=True
    )
    assert dm.num_classes == 2
    assert dm.party_shapes == [(1, 8, 4)] and dm.server_shape == (1, 8, 4)
    digits = load_digits().target
    rows = dm.split_index["train"]
    assert torch.equal(dm.splits["train"].y, torch.from_numpy((digits[rows] < 5).astype("int64")))
    xs, _, _ = next(iter(dm.train_dataloader()))
    assert len(xs) == 2
    with pytest.raises(
        ValueError, match=r"active_party=true needs data.num_parties >= 2 \(.*got 1"
    ):
        VerticalDataModule("breast_cancer", num_parties=1, partition="even", active_party=True)


def _tiny(**kwargs):
    parties = [MLPEncoder((3,), embedding_dim=2, hidden=[]) for _ in range(2)]
    return FedBCD(
        parties,
        LinearHead(2, 2),
        Plain(2),
        lambda params: torch.optim.SGD(params, lr=0.1),
        2,
        **kwargs,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"local_steps": 0}, r"algo.local_steps \(Q\) must be an integer >= 1, got 0"),
        ({"local_steps": 2.5}, r"algo.local_steps \(Q\) must be an integer >= 1, got 2.5"),
        ({"mu": -0.1}, r"algo.mu \(proximal weight\) must be >= 0, got -0.1"),
        (
            {"schedule": "sequential", "mu": 0.1},
            r"parallel schedule only .*fedbcd_s needs mu = 0, got 0.1",
        ),
        ({"schedule": "cyclic"}, r"algo.schedule must be one of .*got 'cyclic'"),
        ({"lr_schedule": "cosine"}, r"algo.lr_schedule must be one of .*got 'cosine'"),
    ],
)
def test_bad_inputs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        _tiny(**kwargs)


def test_max_steps_must_be_a_multiple_of_q(make_cfg):
    cfg = make_cfg("algo=fedbcd", "algo.local_steps=3", "trainer.max_steps=7", *NO_VAL)
    with pytest.raises(ValueError, match="multiple of algo.local_steps = 3, got 7"):
        fit(cfg)


def test_protocols_without_active_party_support_refuse_it():
    from vfl_lightning.algorithms import VFLModule

    class NoActive(VFLModule):
        pass

    with pytest.raises(ValueError, match="NoActive does not support data.active_party=true"):
        NoActive(
            [MLPEncoder((3,), embedding_dim=2)],
            LinearHead(2, 2),
            Plain(1),
            lambda params: torch.optim.SGD(params, lr=0.1),
            2,
            server_party=MLPEncoder((3,), embedding_dim=2),
        )


def test_resume_keeps_the_lr_schedule_and_the_rounds(make_cfg):
    common = [
        *ACTIVE_BC,
        "algo=fedbcd",
        "algo.local_steps=3",
        "algo.lr_schedule=sqrt_decay",
        "trainer.limit_train_batches=4",
        "trainer.limit_val_batches=1",
        "test=false",
    ]
    _, _, results = resume_against_straight(make_cfg, common, epochs=2, first=1)
    assert results["comm/rounds"] == 8 and results["global_step"] == 24
