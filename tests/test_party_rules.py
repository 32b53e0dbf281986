"""A server that controls the arguments of the party calls: it replays the attacks of a curious
server through the runtime's real calls (a Ray party actor's methods, in this process or as a Ray
actor, and the local group's) and shows each fails. A rollback (save, release, load, release
again) is refused, a repeated or earlier round is refused in every release stream, masks never
repeat, a coded party never sends its plain embedding, and a crafted gradient is refused before
it is applied."""

from __future__ import annotations

import asyncio

import lightning as L
import numpy as np
import pytest
import torch
from conftest import RAY_TWO_PARTIES

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.party_rules import PartyGuard
from vfl_lightning.errors import PartyRefusal
from vfl_lightning.mechanisms.base import release_round
from vfl_lightning.mechanisms.secure_agg import PairwiseMasking
from vfl_lightning.run.ray_session import party_trust
from vfl_lightning.runtime.ray_fedvs import FedVSPartyActor, code_parameters
from vfl_lightning.runtime.ray_parties import SyncPartyActor
from vfl_lightning.train import build
from vfl_lightning.wire.codecs import Codec
from vfl_lightning.wire.frames import encode_frame

ROWS = torch.arange(16)


def framed(gradient: torch.Tensor) -> bytes:
    """A gradient in the downlink form the server sends an actor (a frame of its codec)."""
    return encode_frame({"gradient": Codec().encode(gradient)})


def setup(make_cfg, tmp_path, *overrides):
    """(factory, trust) of a two-party Ray run whose parties keep their directories under
    ``tmp_path``."""
    cfg = make_cfg(*RAY_TWO_PARTIES, "runtime=ray", f"runtime.party_dir={tmp_path}", *overrides)
    return PartyFactory.from_config(cfg), party_trust(cfg)


def actors(make_cfg, tmp_path, *overrides) -> list[SyncPartyActor]:
    """The two party actors of that run, in this process (their methods are what a Ray handle
    calls)."""
    factory, trust = setup(make_cfg, tmp_path, *overrides)
    return [SyncPartyActor(factory, m, 1, trust) for m in range(2)]


def agree(parties) -> None:
    published = [party.publish_key("run") for party in parties]
    for party in parties:
        party.agree("run", [i for i, _ in published], [k for _, k in published])


def clipped_embedding(party, rows: torch.Tensor) -> torch.Tensor:
    """The omniscient observer's view of the party's clipped training embedding of ``rows``."""
    with torch.no_grad():
        h = party.own.model(party.features["train"][rows])
    return h.clamp(-party.mechanism.C, party.mechanism.C)


# ----------------------------------------------------------------- rollback (issue's attack 1)
def test_rollback_is_refused_and_a_push_then_release_carries_fresh_ldp_noise(make_cfg, tmp_path):
    """The server saves, takes the real release m = clip(h) + σn, asks the party to load the
    saved state (its model and its private generator), pushes the output to ±C with huge fresh
    gradients and asks for the release again: the load is refused, so is the repeated round; the
    next round carries fresh noise, and the clean embedding does not come back."""
    party = actors(make_cfg, tmp_path, "algo=ldp")[0]
    sigma = party.mechanism.sigma
    party.save_state(0)
    truth = clipped_embedding(party, ROWS)
    first, _ = party.send(ROWS, "train", 0)
    with pytest.raises(PartyRefusal, match="^party 0 refused load_state: it loads state only to"):
        party.load_state(party.run, 0)
    for _ in range(3):
        party.apply_gradient(framed(torch.full_like(first, -1e6)), True, 0.0)
    pushed = clipped_embedding(party, ROWS)
    assert torch.equal(pushed.abs(), torch.ones_like(pushed))  # the server knows it: ±C
    with pytest.raises(PartyRefusal, match="strictly increase within each stream"):
        party.send(ROWS, "train", 0)
    second, _ = party.send(ROWS, "train", 1)
    noise_estimate = second - pushed
    recovered = first - noise_estimate
    error = (recovered - truth).pow(2).mean().sqrt()
    assert error > sigma  # two independent draws: the error is about σ√2, never ~0
    assert not torch.allclose(first - truth, second - pushed)


def test_a_party_resumes_only_from_its_newest_state_and_saves_only_its_current_round(
    make_cfg, tmp_path
):
    """A party resumes from the newest state it saved or the one before it (a server checkpoint
    one save behind: the run stopped between the parties' save and the server's), no older."""
    factory, trust = setup(make_cfg, tmp_path, "algo=ldp")
    party = SyncPartyActor(factory, 0, 1, trust)
    for round in range(3):
        party.save_state(round)
        party.send(ROWS, "train", round)
    with pytest.raises(PartyRefusal, match="saves its state at its current round 3 .* round 1$"):
        party.save_state(1)  # the server's round cannot file the state under another round
    party.save_state(3)
    # a new process of the same party (the same run folder), as after a crash
    restarted = SyncPartyActor(factory, 0, 1, trust)
    with pytest.raises(
        PartyRefusal,
        match="newest state it saved for run .*, round 3, or the one before it, round 2, not "
        "round 1$",
    ):
        restarted.load_state(party.run, 1)
    assert restarted.load_state(party.run, 3) == ""
    with pytest.raises(PartyRefusal, match="strictly increase"):
        restarted.send(ROWS, "train", 2)  # rounds the saved state had released
    restarted.send(ROWS, "train", 3)
    behind = SyncPartyActor(factory, 0, 1, trust)
    assert behind.load_state(party.run, 2) == ""
    with pytest.raises(PartyRefusal, match="strictly increase"):
        behind.send(ROWS, "train", 1)
    behind.send(ROWS, "train", 2)


def test_a_resumed_private_party_draws_fresh_noise(make_cfg, tmp_path):
    """A party restarted from its newest state (as after a crash between a save and later
    releases) never repeats noise it drew: its streams restart from fresh private seeds, so a
    server that asks for the rounds after the save again, on other rows, cannot cancel it."""
    factory, trust = setup(make_cfg, tmp_path, "algo=ldp")
    party = SyncPartyActor(factory, 0, 1, trust)
    party.save_state(0)
    truth = clipped_embedding(party, ROWS)
    before, _ = party.send(ROWS, "train", 0)
    restarted = SyncPartyActor(factory, 0, 1, trust)
    assert restarted.load_state(party.run, 0) == ""
    assert torch.equal(clipped_embedding(restarted, ROWS), truth)  # the same model came back
    after, _ = restarted.send(ROWS, "train", 0)
    assert not torch.allclose(before - truth, after - truth, atol=0.1)


# ----------------------------------------------------------------- rounds and masks (attack 2)
def test_pbm_rounds_never_repeat_and_no_mask_stream_is_used_twice(make_cfg, tmp_path, monkeypatch):
    """A PBM party refuses every repeated or earlier round of a stream, a round of another
    stream than its stage's, and a restart of an evaluation at an earlier release; across every
    call it accepted, no (pair, round) mask stream was applied twice, and two releases of the
    same rows by the same model (at two validation rounds) differ by a near-uniform ring
    element, not by the count difference in [-b, b] a repeated mask would leave."""
    used: list[tuple[int, int]] = []
    original = PairwiseMasking.mask_party

    def recording(self, party, secret, round):
        used.extend((key, party) for key in self.stream_keys(round))
        return original(self, party, secret, round)

    monkeypatch.setattr(PairwiseMasking, "mask_party", recording)
    parties = actors(make_cfg, tmp_path, "algo=pbm")
    agree(parties)
    party = parties[0]
    party.send(ROWS, "train", 0)
    party.send(ROWS, "train", 1)
    for repeated in (1, 0):
        with pytest.raises(PartyRefusal, match="its last train release was round 1"):
            party.send(ROWS, "train", repeated)
    first = release_round("val", 7 << 24)
    party.restart_stream("val", first)
    a, _ = party.send(ROWS, "val", first)
    b, _ = party.send(ROWS, "val", first + 1)
    with pytest.raises(PartyRefusal, match="strictly increase"):
        party.send(ROWS, "val", first)
    with pytest.raises(PartyRefusal, match="a val release takes a round of its val/sanity stream"):
        party.send(ROWS, "val", 2)  # a training round: training round 2's masks on val rows
    with pytest.raises(PartyRefusal, match="restart_stream: release rounds strictly increase"):
        party.restart_stream("val", first)  # replaying the evaluation's noise stream
    party.send(ROWS, "val", release_round("sanity", 0))
    party.restart_stream("test", release_round("test", 0))
    party.send(ROWS, "test", release_round("test", 0))
    assert len(used) == len(set(used)) == 6 * parties[0].mechanism.masking.num_pairs
    modulus, b_trials = party.mechanism.modulus, party.mechanism.b
    difference = (a.long() - b.long()) % modulus
    inside = (difference <= b_trials) | (difference >= modulus - b_trials)
    # a repeated mask would put every element inside; fresh ones, about (2b + 1)/R of them
    assert inside.double().mean() < (2 * b_trials + 1) / modulus + 0.2 < 1


# ----------------------------------------------------------------- plain sends (attack 3)
def test_a_fedvs_client_never_sends_its_plain_embedding(make_cfg, tmp_path):
    """The FedVS client actor the server holds a handle of: its plain send (the issue's
    ``send(idx, stage, None)``) and the baselines' plain embedding are refused."""
    _, module = build(make_cfg("experiment=fedvs_digits"))
    ray_cfg = make_cfg("experiment=fedvs_digits", "runtime=ray", f"runtime.party_dir={tmp_path}")
    code = code_parameters(module.codec)
    factory, trust = PartyFactory.from_config(ray_cfg), party_trust(ray_cfg)
    client = FedVSPartyActor(factory, 0, 1, trust, code, None)
    for stage in ("train", "val", "test"):
        with pytest.raises(PartyRefusal, match="a coded party releases only coded shares"):
            client.send(ROWS, stage, None)
    with pytest.raises(PartyRefusal, match="^party 0 refused plain_embedding: a coded party"):
        asyncio.run(client.plain_embedding(1, ROWS, 0.0))


def test_the_local_fedvs_clients_never_release_a_plain_embedding(make_cfg):
    L.seed_everything(0)
    datamodule, module = build(make_cfg("experiment=fedvs_digits"))
    datamodule.setup("fit")
    xs, _, idx = next(iter(datamodule.val_dataloader()))
    clients = module.party_side
    with pytest.raises(PartyRefusal, match="a coded party releases only coded shares"):
        clients.send(xs, idx, stage="val", round=None)
    with pytest.raises(PartyRefusal, match="a coded party releases only coded shares"):
        clients.eval_embeddings(xs, idx, "val")
    with pytest.raises(PartyRefusal, match="refused plain_embedding: a coded party"):
        clients.plain_round(xs, idx, None, [0, 1, 2, 3], None)
    average = clients.eval_average(xs, idx, "val")  # the coded evaluation decodes the average
    with torch.no_grad():
        plain = torch.stack([p(x) for p, x in zip(module.parties, xs, strict=True)]).mean(0)
    assert average.shape == plain.shape and torch.allclose(average, plain, atol=0.05)


# ----------------------------------------------------------------- crafted gradients
@pytest.mark.parametrize(
    ("craft", "message"),
    [
        (lambda g: g[:, :-1], r"must match its embedding \(\(16, 16\), floating point\), got"),
        (lambda g: g.long(), r"must match its embedding .* torch.int64\)$"),
        (lambda g: g.double() * 1e300, "must be finite"),  # finite in float64, not in float32
        (lambda g: g.index_fill(0, torch.tensor([3]), float("nan")), "must be finite"),
        (lambda g: g.index_fill(0, torch.tensor([3]), float("inf")), "must be finite"),
    ],
    ids=["shape", "dtype", "cast", "nan", "inf"],
)
def test_a_crafted_gradient_is_refused_before_it_is_applied(make_cfg, tmp_path, craft, message):
    party = actors(make_cfg, tmp_path, "algo=npq")[0]
    before = party.party_digest()
    h, _ = party.send(ROWS, "train", 0)
    with pytest.raises(PartyRefusal, match=f"^party 0 refused apply_gradient: .*{message}"):
        party.apply_gradient(framed(craft(torch.ones_like(h))), False, 0.0)
    assert party.party_digest() == before
    for fresh, mu in ((True, float("nan")), (False, -1.0)):
        with pytest.raises(PartyRefusal, match="proximal weight mu"):
            party.apply_gradient(framed(torch.ones_like(h)), fresh, mu)
    with pytest.raises(PartyRefusal, match=r"learning-rate factor is in \(0, 1\]"):
        party.set_lr_factor(1e6)
    party.apply_gradient(framed(torch.ones_like(h) * 1e-3), False, 0.0)
    assert party.party_digest() != before


@pytest.mark.parametrize("action", ["refuse", "clip"])
def test_a_huge_gradient_is_refused_or_clipped_by_the_party_policy(make_cfg, tmp_path, action):
    """The party's own policy file bounds each row's norm: ``refuse`` stops, ``clip`` scales the
    row down to the bound (the update equals the update by the clipped gradient)."""
    import copy

    (tmp_path / "party_0").mkdir()
    (tmp_path / "party_0" / "policy.yaml").write_text(
        f"max_gradient_norm: 2.0\nlarge_gradient: {action}\n"
    )
    party = actors(make_cfg, tmp_path, "algo=npq")[0]
    assert party.own.guard.policy.max_gradient_norm == 2.0
    alone = copy.deepcopy(party.own)
    h, _ = party.send(ROWS, "train", 0)
    x = party.features["train"][ROWS]
    alone.keep(x, alone.forward(x))
    huge = torch.zeros_like(h)
    huge[5] = 1e6
    if action == "refuse":
        with pytest.raises(PartyRefusal, match=r"row has L2 norm 4e\+06, above its .*policy"):
            party.apply_gradient(framed(huge), False, 0.0)
        return
    party.apply_gradient(framed(huge), False, 0.0)
    clipped = huge.clone()
    clipped[5] *= 2.0 / huge[5].norm()
    alone.guard.budget.policy = type(alone.guard.policy)()
    alone.apply_gradient(clipped)
    for mine, theirs in zip(party.own.model.parameters(), alone.model.parameters(), strict=True):
        assert torch.allclose(mine, theirs, rtol=1e-6, atol=1e-7)


def test_the_local_group_refuses_what_an_actor_refuses(make_cfg):
    """The local group runs the same guards: a repeated round, a load after a release and a NaN
    gradient are refused, naming the party."""
    L.seed_everything(0)
    datamodule, module = build(make_cfg("algo=pbm"))
    datamodule.setup("fit")
    xs, _, idx = next(iter(datamodule.train_dataloader()))
    parties = module.party_side
    state = parties.state_dict()
    messages = parties.send(xs, idx, stage="train", round=0)
    with pytest.raises(PartyRefusal, match="party 0 refused send: release rounds strictly"):
        parties.send(xs, idx, stage="train", round=0)
    with pytest.raises(PartyRefusal, match="^party 0 refused load_state: it loads state only"):
        parties.load_state_dict(state)
    gradients = [torch.zeros(m.shape) for m in messages]
    gradients[1] = gradients[1].index_fill(0, torch.tensor([0]), float("nan"))
    with pytest.raises(PartyRefusal, match="^party 1 refused apply_gradient: .* must be finite"):
        parties.apply_gradients(gradients)


def test_one_tensor_handed_to_several_parties_is_checked_for_each(make_cfg):
    """Gradients that are one tensor (a sum fusion's) are measured once, but only views of the
    same memory with the same shape and strides count as one: a view that starts at the same
    address with other strides reaches other values, and its party refuses them."""
    L.seed_everything(0)
    datamodule, module = build(make_cfg("algo=pbm"))
    datamodule.setup("fit")
    xs, _, idx = next(iter(datamodule.train_dataloader()))
    parties = module.party_side
    rows, width = parties.send(xs, idx, stage="train", round=0)[0].shape
    storage = torch.zeros(2 * rows * width)
    storage[(rows - 1) * 2 * width] = float("nan")  # outside the contiguous view, inside the other
    contiguous = storage[: rows * width].view(rows, width)
    strided = storage.view(rows, 2 * width)[:, :width]
    assert contiguous.data_ptr() == strided.data_ptr() and contiguous.shape == strided.shape
    with pytest.raises(PartyRefusal, match="^party 2 refused apply_gradient: .* must be finite"):
        parties.apply_gradients([contiguous, contiguous, strided, contiguous])
    shared = torch.full((rows, width), float("inf"))
    parties.send(xs, idx, stage="train", round=1)
    with pytest.raises(PartyRefusal, match="^party 0 refused apply_gradient: .* must be finite"):
        parties.apply_gradients([shared] * len(parties.members))


# ----------------------------------------------------------------- through Ray itself
def test_ray_actors_refuse_the_rollback_and_the_plain_send(make_cfg, tmp_path, ray_session):
    """The same calls on real Ray actor handles: the refusal reaches the caller as a
    :class:`PartyRefusal` naming the party, the call and the rule."""
    import ray

    cfg = make_cfg(*RAY_TWO_PARTIES, "algo=ldp", "runtime=ray", f"runtime.party_dir={tmp_path}")
    factory, trust = PartyFactory.from_config(cfg), party_trust(cfg)
    actor = ray.remote(SyncPartyActor).options(num_cpus=0).remote(factory, 0, 1, trust)
    try:
        ray.get(actor.save_state.remote(0))
        ray.get(actor.send.remote(ROWS, "train", 0))
        with pytest.raises(PartyRefusal, match="party 0 refused load_state: it loads state"):
            ray.get(actor.load_state.remote(trust.run, 0))
        with pytest.raises(PartyRefusal, match="strictly increase"):
            ray.get(actor.send.remote(ROWS, "train", 0))
        with pytest.raises(PartyRefusal, match="it sends no clean embedding"):
            ray.get(actor.send.remote(ROWS, "val", None))
    finally:
        ray.kill(actor)


def test_ray_actors_refuse_a_repeated_mask_round_and_a_coded_plain_send(
    make_cfg, tmp_path, ray_session
):
    """The issue's other two attacks on real Ray actor handles: two PBM parties that agreed
    their pair seeds refuse a training round again (its masks again), and a FedVS client refuses
    its plain embedding (``send(idx, stage, None)``) at every stage."""
    import ray

    cfg = make_cfg(*RAY_TWO_PARTIES, "algo=pbm", "runtime=ray", f"runtime.party_dir={tmp_path}")
    factory, trust = PartyFactory.from_config(cfg), party_trust(cfg)
    remote = ray.remote(SyncPartyActor).options(num_cpus=0)
    handles = [remote.remote(factory, m, 1, trust) for m in range(2)]
    _, module = build(make_cfg("experiment=fedvs_digits"))
    fedvs = make_cfg("experiment=fedvs_digits", "runtime=ray", f"runtime.party_dir={tmp_path}")
    client = (
        ray.remote(FedVSPartyActor)
        .options(num_cpus=0)
        .remote(
            PartyFactory.from_config(fedvs),
            0,
            1,
            party_trust(fedvs),
            code_parameters(module.codec),
            None,
        )
    )
    try:
        published = ray.get([h.publish_key.remote(trust.run) for h in handles])
        ids, keys = [i for i, _ in published], [k for _, k in published]
        ray.get([h.agree.remote(trust.run, ids, keys) for h in handles])
        ray.get(handles[0].send.remote(ROWS, "train", 0))
        for repeated in (0, 0):
            with pytest.raises(PartyRefusal, match="party 0 refused send: release rounds strictly"):
                ray.get(handles[0].send.remote(ROWS, "train", repeated))
        ray.get(handles[0].send.remote(ROWS, "train", 1))
        for stage in ("train", "val", "test"):
            with pytest.raises(PartyRefusal, match="a coded party releases only coded shares"):
                ray.get(client.send.remote(ROWS, stage, None))
    finally:
        for handle in (*handles, client):
            ray.kill(handle)


@pytest.mark.slow
def test_a_ray_run_stops_failed_in_one_line_when_a_party_refuses(make_cfg, tmp_path, ray_session):
    """A Ray training run whose party 1 allows, in its own ``policy.yaml``, one release
    of each row: the second epoch's first release is refused in that party's process; the run
    stops with the party's line as the error, ``status: failed`` in results.json."""
    import json
    from pathlib import Path

    from vfl_lightning.train import train

    party = 1
    folder = tmp_path / "parties" / f"party_{party}"
    folder.mkdir(parents=True)
    (folder / "policy.yaml").write_text("max_releases_per_row: 1\n")
    cfg = make_cfg(
        *RAY_TWO_PARTIES,
        "algo=pbm",
        "runtime=ray",
        f"runtime.party_dir={tmp_path / 'parties'}",
        "trainer.max_epochs=2",
    )
    with pytest.raises(PartyRefusal) as error:
        train(cfg)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith(f"party {party} refused send: ")
    assert (
        f"party_{party}/policy.yaml: max_releases_per_row=1: this would be release 2 of" in message
    )
    saved = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
    assert saved["status"] == "failed" and saved["error"] == message


def test_rows_outside_a_party_split_are_refused(make_cfg, tmp_path):
    party = actors(make_cfg, tmp_path, "algo=npq")[0]
    size = len(party.features["val"])
    for rows in (torch.tensor([0, size]), torch.tensor([-1])):
        with pytest.raises(PartyRefusal, match=f"its val split has rows 0..{size - 1}, got"):
            party.send(rows, "val", release_round("val", 0))


def test_a_release_before_any_row_is_aligned_says_so():
    guard = PartyGuard(2, split_sizes={"train": 0, "val": 0, "test": 0})
    with pytest.raises(PartyRefusal) as refused:
        guard.check_release("send", "train", None, np.array([0, 3]), None)
    assert str(refused.value) == (
        "party 2 refused send: it holds no train rows yet (a party holds rows only once the "
        "sample alignment has run, and releases none before)"
    )
