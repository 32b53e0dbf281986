"""What a Ray party actor offers whoever holds its handle (runtime=ray): exactly the calls its
protocol family makes, no clean release behind a noisy mechanism, no mask before authenticated
pair seeds, and no unpickling of a state file. Ray exposes every function of an actor class as a
remote call, so the class is the surface; the actors run in this process here (no Ray needed)."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from conftest import RAY_TWO_PARTIES

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.errors import ConfigError, PartyRefusal
from vfl_lightning.mechanisms.secure_agg import PairwiseMasking
from vfl_lightning.run.checks import check_runtime
from vfl_lightning.run.ray_session import party_trust
from vfl_lightning.runtime.party_state import party_state_path
from vfl_lightning.runtime.ray_fedvs import FedVSPartyActor
from vfl_lightning.runtime.ray_parties import AsyncPartyActor, PartyActor, SyncPartyActor

RUNTIME_DIR = Path(__file__).resolve().parents[1] / "vfl_lightning" / "runtime"

COMMON = {
    "publish_key",  # key agreement: the server relays the signed public keys
    "agree",  # key agreement: each party verifies its peers and derives its pair seeds
    "send",  # a batch's release (training, evaluation), through the party's mechanism
    "restart_stream",  # a new evaluation starts its own noise stream
    "party_digest",  # results.json's model_digest: a hash, no parameter
    "save_state",  # a server checkpoint: the party saves its state in its own directory
    "load_state",  # a resume: the party restores its own state of the checkpoint's round
    "privacy_spent",  # results.json: the ε the party counted of its own releases, numbers only
    "psi",  # the sample alignment: bytes in, bytes out; the party's scalar and ids stay inside
}
EXPECTED = {
    PartyActor: COMMON,
    # exchange: the per-batch calls on the run's compiled graph, each through its own method
    SyncPartyActor: COMMON | {"apply_gradient", "set_anchor", "set_lr_factor", "exchange"},
    AsyncPartyActor: COMMON
    | {"set_work_delay", "initial_embeddings", "embed_rows", "client_message", "answer"},
    FedVSPartyActor: COMMON
    | {
        "set_peers",
        "power_info",
        "share_data",
        "receive_data_share",
        "collect_data_shares",
        "share_model",
        "receive_model_share",
        "coded_embedding",
        "update",
        "plain_embedding",
        "update_plain",
        "share_eval_data",
        "receive_eval_data_share",
        "collect_eval_data_shares",
        "share_eval_model",
        "coded_eval_embedding",
    },
}
"""Every call an actor class answers, each one a protocol's (the asynchronous family's initial
pass, refresh and messages are plain embeddings by the protocol: it refuses every mechanism but
plain; FedVS's receive_* are its peers' share deliveries)."""


def remote_calls(actor_class: type) -> set[str]:
    """The methods Ray exposes on a handle of ``actor_class``: every function of the class."""
    return {n for n, _ in inspect.getmembers(actor_class, inspect.isfunction) if n != "__init__"}


def calls_made_by_the_runtime() -> set[str]:
    """Every actor method the runtime's code calls (``x.name.remote(``, ``x.name.bind(`` in a
    compiled graph, a call the graph's exchange carries, ``("name", (...))``, or a share
    delivery named by its string)."""
    source = "\n".join(p.read_text() for p in RUNTIME_DIR.glob("*.py"))
    return (
        set(re.findall(r"\.(\w+)\.(?:remote|bind)\(", source))
        | set(re.findall(r'"(receive_\w+)"', source))
        | set(re.findall(r'\("(\w+)", \(', source))
    )


@pytest.mark.parametrize("actor_class", list(EXPECTED), ids=lambda c: c.__name__)
def test_an_actor_answers_only_the_calls_its_protocols_make(actor_class):
    assert remote_calls(actor_class) == EXPECTED[actor_class]
    assert EXPECTED[actor_class] <= calls_made_by_the_runtime()
    for never in ("state_dict", "load_state_dict", "work_delay", "project_weights"):
        assert never not in remote_calls(actor_class)
    assert parameters(actor_class.load_state) == ["self", "run", "round"]
    assert parameters(actor_class.save_state) == ["self", "round"]


def parameters(method) -> list[str]:
    """``method``'s parameters, without the ``_ray_trace_ctx`` that Ray adds to the signature of
    every method of a class once the class was made an actor in this process."""
    return [name for name in inspect.signature(method).parameters if name != "_ray_trace_ctx"]


def test_only_the_asynchronous_family_embeds_rows_outside_its_mechanism():
    for actor_class in (SyncPartyActor, FedVSPartyActor):
        assert not {"initial_embeddings", "embed_rows"} & remote_calls(actor_class)


def actors(make_cfg, tmp_path, *overrides, actor_class=SyncPartyActor) -> list[PartyActor]:
    cfg = make_cfg(*RAY_TWO_PARTIES, "runtime=ray", f"runtime.party_dir={tmp_path}", *overrides)
    factory, trust = PartyFactory.from_config(cfg), party_trust(cfg)
    threads = torch.get_num_threads()
    return [actor_class(factory, m, threads, trust) for m in range(2)]


def agree(parties: list[PartyActor]) -> None:
    published = [party.publish_key("run") for party in parties]
    for party in parties:
        party.agree("run", [i for i, _ in published], [k for _, k in published])


def test_masks_fail_closed_until_the_authenticated_key_agreement(make_cfg, tmp_path):
    """A PBM party holds no pair seed before the key agreement (none derived from the config's
    seed) and sends nothing; after it, the server cannot unmask one party with derived seeds."""
    parties = actors(make_cfg, tmp_path, "algo=pbm")
    idx = torch.arange(8)
    for m, party in enumerate(parties):
        assert party.mechanism.masking.pairs == []
        with pytest.raises(PermissionError, match=f"^party {m} holds no pair seeds of its own"):
            party.send(idx, "train", 0)
    agree(parties)
    messages = [party.send(idx, "train", 0)[0].long() for party in parties]
    mechanism = parties[0].mechanism
    derived = PairwiseMasking(2, mechanism.bits_per_element, seed=0)
    guess = (messages[0] - derived.party_masks(0, messages[0].shape)[0]) % mechanism.modulus
    # party 0's counts lie in [0, b]; unmasked with the wrong masks they are uniform on [0, R)
    assert (guess > mechanism.b).double().mean() > 0.4
    total = sum(messages) % mechanism.modulus
    assert bool((total <= 2 * mechanism.b).all())  # the true masks cancel in the sum


def test_the_key_agreement_runs_once_with_one_key_per_party(make_cfg, tmp_path):
    """An actor takes one key agreement, with one relayed key per party: an empty, short or long
    list is refused before any pair seed is set, and a second agreement (the same keys, or the
    fresh keys of another run's actors, which verify against the same pinned identities) is
    refused with the first one's pair seeds kept, so its masks still cancel with its peer's."""
    parties = actors(make_cfg, tmp_path, "algo=pbm")
    published = [party.publish_key("run") for party in parties]
    ids, keys = [i for i, _ in published], [k for _, k in published]
    for relayed in ([], keys[:1], [*keys, keys[0]]):
        with pytest.raises(PartyRefusal) as refused:
            parties[0].agree("run", ids, relayed)
        assert str(refused.value) == (
            "party 0 refused agree: the relayed keys are one per party of the run (2), got "
            f"{len(relayed)}"
        )
        assert parties[0].mechanism.masking.pairs == []
    agree(parties)
    seeds = list(parties[0].mechanism.masking.pair_seeds)
    others = actors(make_cfg, tmp_path, "algo=pbm")  # same identities, fresh X25519 keys
    fresh = [party.publish_key("run") for party in others]
    repeat = "party 0 refused agree: the key agreement runs once per session and this one has run"
    for relayed in (keys, [keys[0], fresh[1][1]]):
        with pytest.raises(PartyRefusal, match=f"^{repeat}"):
            parties[0].agree("run", ids, relayed)
    assert parties[0].mechanism.masking.pair_seeds == seeds
    idx = torch.arange(8)
    messages = [party.send(idx, "train", 0)[0].long() for party in parties]
    mechanism = parties[0].mechanism
    assert bool((sum(messages) % mechanism.modulus <= 2 * mechanism.b).all())


def test_an_unseeded_masking_holds_no_pair_and_masks_nothing():
    masking = PairwiseMasking(3, 6)
    assert masking.pairs == []
    with pytest.raises(PermissionError, match="sends no message before the authenticated key"):
        masking.mask_party(1, torch.zeros(4, dtype=torch.int64), 0)


@pytest.mark.parametrize("algo", ["pbm", "ldp"])
def test_a_noisy_party_never_sends_a_clean_embedding(make_cfg, tmp_path, algo):
    party = actors(make_cfg, tmp_path, f"algo={algo}")[0]
    for stage in ("train", "val", "test"):
        with pytest.raises(PartyRefusal, match="it sends no clean embedding"):
            party.send(torch.arange(4), stage, None)


def test_a_plain_party_sends_its_embedding_without_a_round(make_cfg, tmp_path):
    party = actors(make_cfg, tmp_path, "algo=splitnn")[0]
    assert party.send(torch.arange(4), "val", None)[0].shape[0] == 4


class Planted:
    """Unpickling it creates ``marker``: a stand-in for code a planted state file would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_party_loads_its_state_as_tensors_only_from_its_own_directory(make_cfg, tmp_path):
    party = actors(make_cfg, tmp_path / "parties", "algo=pbm")[0]
    party.save_state(5)
    assert party.load_state(party.run, 5) == ""  # model, optimizer, generators: tensors
    marker = tmp_path / "code_ran"
    planted = {"party": 0, "round": 7, "state": Planted(marker)}
    torch.save(planted, party_state_path(tmp_path / "parties", 0, party.run, 7))
    problem = party.load_state(party.run, 7)
    assert problem.startswith("party 0's state file ") and "\n" not in problem
    assert "cannot be read as tensors and plain values" in problem
    assert not marker.exists()
    for run in ("../../elsewhere", "/etc"):  # a run key names a folder of its own, no path
        assert party.load_state(run, 5).startswith("party 0 refuses to resume: a run key is 32")


def test_the_initial_pass_is_sent_once(make_cfg, tmp_path):
    party = actors(make_cfg, tmp_path, "algo=vafl", actor_class=AsyncPartyActor)[0]
    column, _ = party.initial_embeddings(64)
    assert column.shape[0] == len(party.features["train"])
    with pytest.raises(PermissionError, match="^party 0 already sent its initial pass"):
        party.initial_embeddings(64)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["algo=pbm", "mechanism.apply_at_eval=false"], r"^mechanism.apply_at_eval=false under"),
        (["algo=ldp", "mechanism.apply_at_eval=false"], r"^mechanism.apply_at_eval=false under"),
        (["algo=fedvs_wait_dp", "algo.dp.at_eval=false"], r"^algo.dp.at_eval=false under"),
    ],
)
def test_a_clean_evaluation_release_is_refused_under_ray(make_cfg, overrides, message):
    with pytest.raises(ConfigError, match=message) as error:
        check_runtime(make_cfg(*overrides, "runtime=ray"))
    assert "epsilon = inf" in str(error.value) and "\n" not in str(error.value)
    check_runtime(make_cfg(*overrides))  # runtime=local simulates it (and reports ε = ∞)


def test_an_actor_updates_through_the_party_it_wraps(make_cfg, tmp_path):
    """The actor's protocol calls drive its wrapped :class:`Party`, the class the local parties
    hold: a copy of that party, given the same message and gradient (FedBCD's fresh local step
    with FedPBCD's proximal term included), ends with the same parameters."""
    import copy

    from vfl_lightning.algorithms.party import Party
    from vfl_lightning.wire.codecs import Codec
    from vfl_lightning.wire.frames import encode_frame

    party = actors(make_cfg, tmp_path, "algo=fedpbcd")[0]
    assert isinstance(party.own, Party)
    alone = copy.deepcopy(party.own)
    start = alone.digest()
    party.set_anchor()
    alone.set_anchor()
    idx = torch.arange(8)
    message, _ = party.send(idx, "train", None)
    x = party.features["train"][idx]
    alone.keep(x, alone.forward(x))
    assert torch.equal(message, alone.h.detach())
    gradient = torch.randn_like(message)
    framed = encode_frame({"gradient": Codec().encode(gradient)})  # its downlink form
    for fresh in (False, True):
        party.apply_gradient(framed, fresh, 0.1)
        alone.apply_gradient(gradient, fresh=fresh, mu=0.1)
    assert party.party_digest() == alone.digest() != start
