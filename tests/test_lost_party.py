"""The one line of a run a lost party stopped, under runtime=ray and runtime=grpc: it names the
run's own checkpoint and offers resuming only when that checkpoint exists."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vfl_lightning.checkpoints import LastCheckpoint, resumable_checkpoint
from vfl_lightning.errors import PartyLost


def trainer_with(tmp_path, *, written: bool, resumed: str | None = None):
    callback = LastCheckpoint(str(tmp_path / "run" / "checkpoints"))
    if written:
        callback.path.parent.mkdir(parents=True)
        callback.path.write_bytes(b"checkpoint")
        callback.last_model_path = str(callback.path)
    return SimpleNamespace(callbacks=[callback], ckpt_path=resumed)


def test_the_resumable_checkpoint_is_the_one_written_else_the_one_resumed_from(tmp_path):
    written = trainer_with(tmp_path, written=True)
    assert resumable_checkpoint(written) == str(tmp_path / "run/checkpoints/last.ckpt")
    assert resumable_checkpoint(trainer_with(tmp_path / "a", written=False)) is None
    earlier = tmp_path / "earlier.ckpt"
    earlier.write_bytes(b"checkpoint")
    resumed = trainer_with(tmp_path / "b", written=False, resumed=str(earlier))
    assert resumable_checkpoint(resumed) == str(earlier)
    gone = trainer_with(tmp_path / "c", written=False, resumed=str(tmp_path / "gone.ckpt"))
    assert resumable_checkpoint(gone) is None
    assert resumable_checkpoint(None) is None


def grpc_line(round: int, checkpoint: str | None) -> str:
    from vfl_lightning.runtime.grpc_parties import GrpcParties

    parties = SimpleNamespace(round_fn=lambda: round, checkpoint_fn=lambda: checkpoint)
    cause = PartyLost("party 1 at 10.0.0.6:50051 is lost (Send: UNAVAILABLE: closed)")
    return str(GrpcParties.lost(parties, cause, "Send"))


def test_a_lost_grpc_party_offers_the_runs_own_checkpoint(tmp_path):
    checkpoint = str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert grpc_line(41, checkpoint) == (
        "party 1 at 10.0.0.6:50051 is lost (Send: UNAVAILABLE: closed) at training round 41 "
        "(Send); the run stopped, its last checkpoint is intact: restart the party program and "
        f"resume with ckpt_path={checkpoint}"
    )


@pytest.mark.parametrize("round", [0, 3])
def test_a_lost_grpc_party_before_the_first_checkpoint_offers_no_resume(round):
    line = grpc_line(round, None)
    assert "ckpt_path" not in line and "<" not in line
    assert line.endswith(
        f"at training round {round} (Send); the run stopped before it wrote a checkpoint: restart "
        "the party program and run the same command again (there is nothing to resume from)"
    )


def ray_line(round: int, checkpoint: str | None, error=None) -> str:
    from vfl_lightning.runtime.ray_parties import RayParties

    parties = SimpleNamespace(round_fn=lambda: round, checkpoint_fn=lambda: checkpoint)
    return str(RayParties.lost(parties, 1, "send", error))


def test_a_dead_ray_actor_offers_the_runs_own_checkpoint(tmp_path):
    checkpoint = str(tmp_path / "run" / "checkpoints" / "last.ckpt")
    assert ray_line(6, checkpoint) == (
        "party 1's Ray actor died at training round 6 (send); the run stopped, its last "
        f"checkpoint is intact: resume with ckpt_path={checkpoint}"
    )


def test_a_dead_ray_actor_before_any_checkpoint_offers_no_resume():
    assert ray_line(6, None) == (
        "party 1's Ray actor died at training round 6 (send); the run stopped before it wrote a "
        "checkpoint: run the same command again (there is nothing to resume from)"
    )
    assert ray_line(0, None) == (
        "party 1's Ray actor died at training round 0 (send); the run stopped before training: "
        "run the same command again"
    )
