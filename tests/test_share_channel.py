"""FedVS shares under runtime=ray travel sealed for the client they are meant for: an actor
handle the server puts in a client's peer list reads nothing, and a share the named sender did
not seal for this client and exchange is refused. The client actors run in this process; the
handle the server controls records what it is sent."""

from __future__ import annotations

import asyncio
import secrets

import pytest
import torch

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.runtime.party_trust import PartyTrust
from vfl_lightning.runtime.ray_fedvs import FedVSPartyActor, code_parameters
from vfl_lightning.runtime.share_channel import Mailbox, SealedShare
from vfl_lightning.train import build


class ServerHandle:
    """An actor handle of the server's: every ``.method.remote(*args)`` made on it is kept."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple]] = []

    def __getattr__(self, method: str):
        calls = self.calls

        class Call:
            @staticmethod
            def remote(*args):
                calls.append((method, args))

        return Call()


@pytest.fixture(scope="module")
def clients(tmp_path_factory):
    from conftest import compose_config

    root = tmp_path_factory.mktemp("share_channel")
    cfg = compose_config(root / "run", "experiment=fedvs_digits", "data.num_parties=4")
    _, module = build(cfg)
    factory = PartyFactory.from_config(cfg)
    trust = PartyTrust(party_seeds="private", party_dir=str(root / "parties"))
    threads = torch.get_num_threads()
    code = code_parameters(module.codec)
    actors = [FedVSPartyActor(factory, m, threads, trust, code, None) for m in range(4)]
    published = [actor.publish_key("run") for actor in actors]
    for actor in actors:
        actor.agree("run", [i for i, _ in published], [k for _, k in published])
    return actors


def test_shares_sent_to_a_server_handle_are_sealed_and_only_their_client_opens_them(clients):
    sender, receiver = clients[0], clients[1]
    handles = [None, ServerHandle(), ServerHandle(), ServerHandle()]
    sender.set_peers(handles)
    asyncio.run(sender.share_model(1, 0.0))
    for handle in handles[1:]:
        [(method, (exchange, claimed, sealed))] = handle.calls
        assert (method, exchange, claimed) == ("receive_model_share", 1, 0)
        assert isinstance(sealed, SealedShare)  # never the share itself
    _, (_, _, sealed) = handles[1].calls[0]
    eavesdropper = Mailbox(1)
    eavesdropper.set_channel_keys({0: secrets.token_bytes(32)})
    with pytest.raises(PermissionError, match="^client 1 refuses a share claimed from client 0"):
        eavesdropper.open("receive_model_share", (1,), 0, sealed)
    asyncio.run(receiver.receive_model_share(1, 0, sealed))
    share = receiver.model_inbox[1][0]
    assert share.shape == sealed.shape and share.dtype == receiver.codec.storage_dtype
    assert share.numpy().tobytes() not in sealed.ciphertext


def test_a_share_not_sealed_by_its_claimed_sender_for_this_exchange_is_refused(clients):
    sender, receiver = clients[2], clients[1]
    handle = ServerHandle()
    sender.set_peers([handle, handle, handle, handle])
    asyncio.run(sender.share_model(5, 0.0))
    sealed = handle.calls[1][1][2]  # sent to clients 0, 1, 3 in turn: client 1's
    forged = Mailbox(3)
    forged.set_channel_keys({1: secrets.token_bytes(32)})
    raw = torch.zeros(sealed.shape, dtype=receiver.codec.storage_dtype)
    attempts = [
        (6, 2, sealed),  # replayed into another exchange
        (5, 3, sealed),  # claimed from another client
        (5, 2, forged.seal("receive_model_share", (5,), 1, raw)),  # sealed by someone else
        (5, 2, raw),  # not sealed at all
    ]
    for exchange, claimed, message in attempts:
        with pytest.raises(PermissionError, match=f"claimed from client {claimed}"):
            asyncio.run(receiver.receive_model_share(exchange, claimed, message))
    asyncio.run(receiver.receive_model_share(5, 2, sealed))


def test_no_share_is_sealed_before_the_key_agreement():
    mailbox = Mailbox(0)
    with pytest.raises(PermissionError, match="holds no channel key with client 1: it sends no"):
        mailbox.seal("receive_data_share", (), 1, torch.zeros(2))
