"""The one map from a protocol's party interface to the ``runtime=grpc`` transport that implements
it (the protocol never imports grpc)."""

from __future__ import annotations

from vfl_lightning.algorithms.fedvs_parties import FedVSParties
from vfl_lightning.algorithms.parties import Parties
from vfl_lightning.runtime.grpc_async import GrpcAsyncParties
from vfl_lightning.runtime.grpc_fedvs import GrpcFedVSParties
from vfl_lightning.runtime.grpc_parties import GrpcParties


def grpc_parties(module, channels, proposals, **options) -> Parties:
    """The parties of ``module`` as party programs behind ``channels``, through the transport
    of its ``PARTY_INTERFACE`` and family of party calls."""
    transports = {
        ("sync", Parties): GrpcParties,
        ("async", Parties): GrpcAsyncParties,
        ("fedvs", FedVSParties): GrpcFedVSParties,
    }
    key = (module.PARTY_CALLS, module.PARTY_INTERFACE)
    transport = transports.get(key)
    if transport is None:
        raise ValueError(
            f"no gRPC transport for {type(module).__name__} (party calls {key[0]!r}, interface "
            f"{key[1].__name__})"
        )
    public = {k: v for k, v in module.transport_options().items() if k != "asynchronous"}
    if module.PARTY_CALLS in ("async", "fedvs"):
        public["streams"] = module.streams
    return transport(channels, proposals, **public, **options)
