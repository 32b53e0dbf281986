"""Capabilities are declared, not inherited: a protocol subclass runs only locally and on one
process unless it opts into runtimes and data parallelism itself (a subclass that changes a wire
step could otherwise claim Ray, gRPC and DDP without ever having been run there)."""

from __future__ import annotations

import pytest

from vfl_lightning.algorithms.fedbcd import FedBCD
from vfl_lightning.algorithms.sync import SyncVFL
from vfl_lightning.errors import ConfigError
from vfl_lightning.run.checks import check_runtime
from vfl_lightning.run.config_checks import check_data_parallel


class Rewired(SyncVFL):
    """Overrides a wire step (what crosses the downlink) and declares nothing."""

    def send_gradients(self, fused_grad):
        gradients = self.mechanism.party_gradients(fused_grad, self.widths)
        return self.wire.downlink([g.sign() for g in gradients], bits_per_element=1)


class OptedIn(Rewired):
    """The same protocol, opting into Ray and DDP after checking it runs there."""

    RUNTIMES = ("local", "ray")
    DATA_PARALLEL = True


def test_a_subclass_that_declares_nothing_runs_only_locally_on_one_process():
    assert SyncVFL.RUNTIMES == ("local", "ray", "grpc") and SyncVFL.DATA_PARALLEL
    assert Rewired.RUNTIMES == ("local",) and Rewired.DATA_PARALLEL is False
    assert OptedIn.RUNTIMES == ("local", "ray") and OptedIn.DATA_PARALLEL is True
    assert FedBCD.RUNTIMES == ("local", "ray", "grpc") and FedBCD.DATA_PARALLEL is True


@pytest.mark.parametrize("runtime", ["ray", "grpc"])
def test_ray_and_grpc_refuse_the_subclass_in_one_line(make_cfg, runtime):
    cfg = make_cfg("algo=npq", f"runtime={runtime}", "algo._target_=test_capabilities.Rewired")
    with pytest.raises(ConfigError) as refused:
        check_runtime(cfg)
    assert str(refused.value).startswith(
        f"algo=npq does not run on runtime={runtime} (it runs on local)"
    )
    opted = make_cfg("algo=npq", "runtime=ray", "algo._target_=test_capabilities.OptedIn")
    opted.runtime.party_seeds = "derived"
    check_runtime(opted)


def test_ddp_refuses_the_subclass_in_one_line(make_cfg):
    cfg = make_cfg("algo=npq", "trainer=ddp", "trainer.devices=2", "trainer.accelerator=cpu")
    check_data_parallel(cfg, OptedIn)
    with pytest.raises(ConfigError, match=r"^algo=npq cannot run data-parallel"):
        check_data_parallel(cfg, Rewired)


class HalfKept(SyncVFL):
    """A protocol that sends each party only the larger half of its gradient's entries, and
    says so with its own downlink codec."""

    def downlink_codec(self):
        from vfl_lightning.wire.codecs import TopKCodec

        return TopKCodec(0.5)

    def send_gradients(self, fused_grad):
        from vfl_lightning.privacy.defenses.gradient import sparsify

        gradients = self.mechanism.party_gradients(fused_grad, self.widths)
        return self.wire.downlink([sparsify(g, keep_fraction=0.5) for g in gradients])


def test_a_protocol_provides_its_own_downlink_codec(make_cfg):
    """The wire counts a protocol's gradients in the form its codec sends them."""
    from vfl_lightning.train import train

    common = ["algo=npq", "trainer.max_epochs=1", "trainer.limit_train_batches=3", "test=false"]
    plain = train(make_cfg(*common))
    halved = train(make_cfg(*common, "algo._target_=test_capabilities.HalfKept"))
    # 3 rounds, 4 parties, 32 x 16 gradients: 256 kept entries at 32 + 9 bits instead of 512 x 32
    assert plain["comm/downlink_mb"] == 3 * 4 * 512 * 32 / 8e6
    assert halved["comm/downlink_mb"] == 3 * 4 * 256 * 41 / 8e6


def test_message_canaries_are_opted_into(make_cfg):
    """``audit=canary_message`` needs every training release to go through the parties' send:
    the sync family and FedBCD declare it; a subclass that declares nothing is refused."""
    from vfl_lightning.train import train

    assert SyncVFL.RELEASE_CANARIES and FedBCD.RELEASE_CANARIES
    assert Rewired.RELEASE_CANARIES is False and OptedIn.RELEASE_CANARIES is False
    cfg = make_cfg("algo=ldp", "audit=canary_message", "algo._target_=test_capabilities.Rewired")
    with pytest.raises(ConfigError, match=r"^audit=canary_message: Rewired releases its"):
        train(cfg)
