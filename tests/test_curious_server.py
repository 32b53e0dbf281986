"""A curious server: from what it holds (the config with the seed, its checkpoint, its
wire transcript) it cannot recompute a party's noise under private party seeds, cannot substitute
a key, never sees repeated evaluation noise, and logs no clean accuracy under runtime=ray."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from conftest import RAY_TWO_PARTIES

from vfl_lightning.algorithms.local_parties import LocalParties
from vfl_lightning.algorithms.parties import PartyGenerators
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.base import RELEASE_STREAMS, STREAM_SHIFT
from vfl_lightning.mechanisms.identity import KeyAuthenticationError, sign_public_key
from vfl_lightning.mechanisms.keys import fresh_private_key, public_bytes
from vfl_lightning.privacy.accountant import composed_rdp
from vfl_lightning.privacy.analysis import DEFAULT_ORDERS, rdp_to_dp
from vfl_lightning.run.checks import check_runtime
from vfl_lightning.run.ray_session import party_trust
from vfl_lightning.runtime.party_trust import KNOWN_PARTIES_FILE
from vfl_lightning.runtime.ray_parties import RayParties
from vfl_lightning.seeding import seeded_generator
from vfl_lightning.train import train

SMALL = [*RAY_TWO_PARTIES, "trainer.max_epochs=1", "trainer.limit_train_batches=1"]
SMALL += ["trainer.num_sanity_val_steps=0", "test=false"]


@pytest.fixture
def transcript(monkeypatch):
    """Every message the server receives, as (stage, idx, round, [party 0's, party 1's, ...]):
    the server's wire transcript, recorded where the server's process gets it."""
    records: list = []

    def recording(original):
        def send(self, xs, idx, *, stage, round):
            messages = original(self, xs, idx, stage=stage, round=round)
            copies = [m.detach().to("cpu").clone() for m in messages]
            records.append((stage, idx.detach().to("cpu").clone(), round, copies))
            return messages

        return send

    for parties in (LocalParties, RayParties):
        monkeypatch.setattr(parties, "send", recording(parties.send))
    return records


def true_embeddings(cfg, idx: torch.Tensor) -> list[torch.Tensor]:
    """What only the parties know (the test is omniscient): each party's embedding of training
    rows ``idx`` at round 0, from its initial model, built as every party builds it."""
    factory = PartyFactory.from_config(cfg)
    embeddings = []
    for m in range(2):
        kit = factory.party(m)
        with torch.no_grad():
            embeddings.append(kit.model.train()(kit.features["train"][idx]))
    return embeddings


def attack(cfg, transcript) -> float:
    """The server recomputes the parties' round-0 training noise the derived way (from the seed
    in its config) and checks it against its transcript: the fraction of elements it gets wrong
    (PBM: the unmasked count sum; LDP: party 0's clipped embedding recovered to 1e-4)."""
    stage, idx, round, messages = transcript[0]
    assert (stage, round) == ("train", 0)
    mechanism = PartyFactory.from_config(cfg).mechanism(2)
    truth = [h.clamp(-mechanism.C, mechanism.C) for h in true_embeddings(cfg, idx)]
    derived = [seeded_generator(cfg.seed, "party", "train", m) for m in range(2)]
    if cfg.algo.name == "pbm":
        counts = [mechanism.quantize(h[None], [g])[0] for h, g in zip(truth, derived, strict=True)]
        predicted = sum(counts) % mechanism.modulus
        observed = sum(messages) % mechanism.modulus
        return (predicted != observed).double().mean().item()
    noise = torch.randn(truth[0].shape, generator=derived[0], dtype=truth[0].dtype)
    recovered = messages[0] - mechanism.sigma * noise
    return ((recovered - truth[0]).abs() > 1e-4).double().mean().item()


# ----------------------------------------------------------------- (b) noise from what the server holds
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["pbm", "ldp"])
def test_b_server_recomputes_party_noise_only_when_it_is_derived(
    make_cfg, ray_session, transcript, algo
):
    derived = make_cfg(f"algo={algo}", *SMALL, "runtime=ray", "runtime.party_seeds=derived")
    train(derived)
    assert attack(derived, transcript) == 0.0  # the attack is sound: it works on derived seeds
    transcript.clear()
    private = make_cfg(f"algo={algo}", *SMALL, "runtime=ray")
    assert private.runtime.party_seeds == "private"  # the Ray default
    results = train(private)
    assert results["party_seeds"] == "private"
    assert attack(private, transcript) > 0.2


@pytest.mark.slow
def test_two_identical_private_runs_release_different_noise(make_cfg, ray_session, transcript):
    common = ["algo=ldp", *SMALL, "runtime=ray"]
    first, second = train(make_cfg(*common)), train(make_cfg(*common))
    assert first["model_digest"] != second["model_digest"]
    assert not torch.equal(transcript[0][3][0], transcript[1][3][0])


# ----------------------------------------------------------------- (c) substituted keys
class SubstitutingServer(RayParties):
    """Relays its own X25519 key, signed by its own identity, in place of party 1's."""

    def relay(self, identities, keys):
        own_identity = fresh_identity()
        forged = sign_public_key(
            own_identity, run_id="any", party=1, public_key=public_bytes(fresh_private_key())
        )
        return identities, [keys[0], forged]


class SwappingServer(RayParties):
    """Keeps party 1's signature but swaps the public key under it for its own."""

    def relay(self, identities, keys):
        swapped = type(keys[1])(1, public_bytes(fresh_private_key()), keys[1].signature)
        return identities, [keys[0], swapped]


def fresh_identity():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


def use_server(monkeypatch, server: type) -> None:
    from vfl_lightning.algorithms.parties import Parties
    from vfl_lightning.runtime import registry

    monkeypatch.setitem(registry.RAY_TRANSPORTS, Parties, server)


@pytest.mark.slow
def test_c_a_substituted_key_stops_the_run_naming_the_party(
    make_cfg, ray_session, monkeypatch, tmp_path
):
    common = ["algo=pbm", *SMALL, "runtime=ray", f"runtime.party_dir={tmp_path / 'parties'}"]
    train(make_cfg(*common))  # first use: identities made, peers pinned
    pinned = json.loads((tmp_path / "parties" / "party_0" / KNOWN_PARTIES_FILE).read_text())
    assert sorted(pinned["parties"]) == ["0", "1"]
    for server in (SubstitutingServer, SwappingServer):
        use_server(monkeypatch, server)
        cfg = make_cfg(*common)
        with pytest.raises(KeyAuthenticationError) as error:
            train(cfg)
        message = str(error.value)
        assert message.startswith("party 1's public key fails its identity signature")
        assert "\n" not in message
        results = json.loads((Path(cfg.paths.output_dir) / "results.json").read_text())
        assert results["status"] == "failed" and results["error"] == message


@pytest.mark.slow
def test_c_pinned_identities_from_the_config_refuse_a_first_use_substitution(
    make_cfg, ray_session, monkeypatch, tmp_path
):
    """With runtime.known_parties given, even a first run's forged identity is refused."""
    from vfl_lightning.mechanisms.identity import identity_public_bytes, load_or_create_identity

    parties = tmp_path / "parties"
    pins = [identity_public_bytes(load_or_create_identity(parties / f"party_{m}")) for m in (0, 1)]
    use_server(monkeypatch, SubstitutingServer)
    pinned = f"runtime.known_parties={{0: '{pins[0].hex()}', 1: '{pins[1].hex()}'}}"
    cfg = make_cfg("algo=pbm", *SMALL, "runtime=ray", f"runtime.party_dir={parties}", pinned)
    assert not (parties / "party_0" / KNOWN_PARTIES_FILE).exists()
    with pytest.raises(KeyAuthenticationError, match="^party 1's public key fails"):
        train(cfg)


# ----------------------------------------------------------------- (d) fresh evaluation noise
def validation_messages(transcript) -> list[torch.Tensor]:
    """Party 0's first validation message of every validation epoch (sanity check excluded)."""
    val = RELEASE_STREAMS.index("val")
    return [
        messages[0]
        for stage, _, round, messages in transcript
        if stage == "val" and round is not None and round >> STREAM_SHIFT == val
    ]


def check_fresh_evaluation_noise(cfg, transcript) -> dict:
    """Two validation epochs of one model (lr 0) release the same clean embedding plus noise:
    their difference is N(0, 2σ²) per element, not zero as with restarted noise."""
    results = train(cfg)
    first, second = validation_messages(transcript)[:2]
    sigma = PartyFactory.from_config(cfg).mechanism(2).sigma
    spread = ((first - second) / (sigma * 2**0.5)).std().item()
    assert 0.85 < spread < 1.15, spread  # 512 elements: the std's standard error is ~0.03
    return results


LDP_TWO_EPOCHS = ["algo=ldp", *RAY_TWO_PARTIES, "optimizer.lr=0", "trainer.max_epochs=2"]
LDP_TWO_EPOCHS += ["trainer.limit_train_batches=1", "trainer.num_sanity_val_steps=1", "test=false"]


def test_d_two_validation_epochs_release_different_noise_local(make_cfg, transcript):
    results = check_fresh_evaluation_noise(make_cfg(*LDP_TWO_EPOCHS), transcript)
    # evaluation ε: the sanity check and two epochs released the first validation batch 3 times
    assert results["privacy/eval_uses_per_sample"] == 3
    mechanism = PartyFactory.from_config(make_cfg(*LDP_TWO_EPOCHS)).mechanism(2)
    rdp = composed_rdp(mechanism, "feature", orders=DEFAULT_ORDERS, embedding_dim=16, uses=3)
    expected, _ = rdp_to_dp(orders=DEFAULT_ORDERS, rdp=rdp, delta=1e-5)
    assert results["privacy/eval_feature_eps"] == pytest.approx(expected, rel=1e-12)
    assert results["privacy/eval_feature_eps"] > 0


@pytest.mark.slow
def test_d_two_validation_epochs_release_different_noise_ray(make_cfg, ray_session, transcript):
    check_fresh_evaluation_noise(make_cfg(*LDP_TWO_EPOCHS, "runtime=ray"), transcript)


# ----------------------------------------------------------------- (e) no clean accuracy under Ray
@pytest.mark.slow
def test_e_acc_clean_is_not_logged_under_ray(make_cfg, ray_session, caplog):
    common = ["algo=pbm", *SMALL[:-1], "trainer.limit_train_batches=3"]
    local = train(make_cfg(*common))
    with caplog.at_level(logging.WARNING):
        remote = train(make_cfg(*common, "runtime=ray", "runtime.party_seeds=derived"))
    for key in ("val/acc_clean", "test/acc_clean"):
        assert key in local and key not in remote, key
    assert remote["val/acc"] == local["val/acc"] and remote["test/acc"] == local["test/acc"]
    assert (local["party_seeds"], remote["party_seeds"]) == ("derived", "derived")
    warnings = [r.getMessage() for r in caplog.records if "party_seeds=derived" in r.getMessage()]
    assert len(warnings) == 1 and "known to whoever holds the config" in warnings[0]


# ----------------------------------------------------------------- party seeds, no Ray needed
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["runtime.party_seeds=private"], r"^runtime.party_seeds=private needs runtime=ray"),
        (
            ["runtime=ray", "runtime.party_seeds=secret"],
            r"^runtime.party_seeds must be one of \('private', 'derived'\), got 'secret'$",
        ),
    ],
)
def test_party_seeds_refused_in_one_line(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_runtime(make_cfg(*overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["runtime.known_parties=[ab]"],
            r"^runtime.known_parties must be a mapping \{party index: 64 hex digits\} or null, "
            r"got \['ab'\]$",
        ),
        (
            ["runtime.known_parties={0: 'zz'}"],
            r"^runtime.known_parties: known party 0: needs an integer index >= 0 and 64 hex "
            r"digits, got 'zz'$",
        ),
        (
            ["runtime.known_parties={0: 'abcd'}"],
            r"^runtime.known_parties: known party 0: .* got 4 digits$",
        ),
    ],
)
def test_bad_trust_settings_refused_in_one_line(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message):
        party_trust(make_cfg("runtime=ray", *overrides))


def test_private_streams_never_pass_through_the_seeding_function(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a private stream went through derive_seed")

    monkeypatch.setattr("vfl_lightning.algorithms.parties.derive_seed", refuse)
    gens = PartyGenerators(0, 1, party_seeds="private")
    gens.restart("val", 5)
    draws = [torch.rand(4, generator=gens.get(s)) for s in ("train", "val", "delays")]
    replay = torch.rand(4, generator=gens.replay("fedvs_data"))
    assert torch.equal(replay, torch.rand(4, generator=gens.replay("fedvs_data")))
    other = PartyGenerators(0, 1, party_seeds="private")
    assert not torch.equal(draws[0], torch.rand(4, generator=other.get("train")))


def test_private_replay_seeds_travel_in_the_party_state_and_its_streams_restart_fresh():
    """A private party's state carries the seeds of its replayed streams (FedVS's data shares are
    re-sent identical) and no stream state: a party resumed from it draws its continuing streams
    from fresh seeds, so it never repeats noise it drew before it stopped. Derived streams
    continue exactly (a simulation's resume reproduces the uninterrupted run)."""
    gens = PartyGenerators(0, 0, party_seeds="private")
    torch.rand(3, generator=gens.get("train"))
    torch.rand(3, generator=gens.get("delays"))
    replay = torch.rand(4, generator=gens.replay("fedvs_data"))
    state = gens.state_dict()
    assert set(state) == {"replay_seeds"}
    restored = PartyGenerators(0, 0, party_seeds="private")
    restored.load_state_dict(state)
    for stream in ("train", "delays"):
        assert not torch.equal(
            torch.rand(5, generator=gens.get(stream)),
            torch.rand(5, generator=restored.get(stream)),
        )
    assert torch.equal(replay, torch.rand(4, generator=restored.replay("fedvs_data")))
    derived = PartyGenerators(0, 0)
    torch.rand(3, generator=derived.get("train"))
    again = PartyGenerators(0, 0)
    again.load_state_dict(derived.state_dict())
    assert torch.equal(
        torch.rand(5, generator=derived.get("train")), torch.rand(5, generator=again.get("train"))
    )


@pytest.mark.parametrize(("written", "resumed"), [("derived", "private"), ("private", "derived")])
def test_party_state_resumes_only_under_the_party_seeds_it_was_written_with(written, resumed):
    state = PartyGenerators(0, 0, party_seeds=written).state_dict()
    with pytest.raises(
        ValueError,
        match=f"^this checkpoint's party streams were drawn with "
        f"runtime.party_seeds={written}: resume it with runtime.party_seeds={written}$",
    ):
        PartyGenerators(0, 0, party_seeds=resumed).load_state_dict(state)


def test_derived_evaluation_seeds_are_fresh_per_evaluation_and_reproducible():
    def first_draw(release: int) -> torch.Tensor:
        gens = PartyGenerators(7, 1)
        gens.restart("val", release)
        return torch.rand(4, generator=gens.get("val"))

    assert torch.equal(first_draw(3), first_draw(3))
    assert not torch.equal(first_draw(3), first_draw(4))
    plain = torch.rand(4, generator=PartyGenerators(7, 1).get("train"))
    assert torch.equal(plain, torch.rand(4, generator=seeded_generator(7, "party", "train", 1)))


# ----------------------------------------------------------------- private state across a resume
class CheckPartyStreams(L.Callback):
    """At train start every actor's replay seeds (FedVS's data shares) equal those its party
    saved in its own directory for ``ckpt_path``'s round, the state file holds no stream state
    of a private party, and its continuing streams start afresh: the private state came back to
    its party, and no noise it drew before is drawn again."""

    def __init__(self, ckpt_path: str) -> None:
        self.ckpt_path = ckpt_path

    def on_train_start(self, trainer, pl_module) -> None:

        from conftest import actor_states

        from vfl_lightning.runtime.party_state import load_party_state

        kept = torch.load(self.ckpt_path, weights_only=False)["vfl"]["parties"]
        party_dir = pl_module.party_side.trust.root()
        actors = pl_module.party_side.actors
        saved = [
            load_party_state(party_dir, m, kept["run"], kept["round"])[0]
            for m in range(len(actors))
        ]
        now = actor_states(pl_module.party_side)
        for before, after in zip(saved, now, strict=True):
            before, after = before["generators"], after["generators"]
            assert sorted(before) == sorted(after) == ["replay_seeds"]
            assert before["replay_seeds"] == after["replay_seeds"]


@pytest.mark.slow
@pytest.mark.parametrize(
    "overrides",
    [
        ["algo=cascade", *RAY_TWO_PARTIES, "algo.client_speeds=[1,2]"],
        ["experiment=fedvs_digits", "data.num_parties=4", "trainer.limit_val_batches=1"],
    ],
    ids=["cascade", "fedvs"],
)
def test_private_party_streams_resume_from_the_party_state(make_cfg, ray_session, overrides):
    common = [*overrides, "runtime=ray", "trainer.limit_train_batches=2", "test=false"]
    first = make_cfg(*common, "trainer.max_epochs=1")
    train(first)
    checkpoint = Path(first.paths.output_dir) / "checkpoints" / "last.ckpt"
    check = [f"_target_={__name__}.CheckPartyStreams", f"ckpt_path={checkpoint}"]
    resumed = train(
        make_cfg(
            *common,
            "trainer.max_epochs=2",
            f"ckpt_path={checkpoint}",
            *[f"+callbacks.check.{k}" for k in check],
        )
    )
    assert resumed["status"] == "finished" and resumed["party_seeds"] == "private"
