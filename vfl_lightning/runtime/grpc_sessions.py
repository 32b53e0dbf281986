"""The party session of each family of party calls (a protocol's ``PARTY_CALLS``) under
``runtime=grpc``."""

from __future__ import annotations

from vfl_lightning.runtime.grpc_async import AsyncPartySession
from vfl_lightning.runtime.grpc_fedvs_party import FedVSPartySession
from vfl_lightning.runtime.grpc_party import PartySession

SESSIONS = {"sync": PartySession, "async": AsyncPartySession, "fedvs": FedVSPartySession}
