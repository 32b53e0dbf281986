"""The one map from a protocol's party interface to the Ray transport that implements it: a
protocol names the interface it talks to (``PARTY_INTERFACE``) and never imports Ray."""

from __future__ import annotations

from vfl_lightning.algorithms.fedvs_parties import FedVSParties
from vfl_lightning.algorithms.parties import Parties
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.runtime.ray_fedvs import RayFedVSParties
from vfl_lightning.runtime.ray_parties import RayParties

RAY_TRANSPORTS: dict[type, type] = {Parties: RayParties, FedVSParties: RayFedVSParties}


def ray_parties(module, factory: PartyFactory, **options) -> Parties:
    """The parties of ``module`` as Ray actors built by ``factory``, through the transport of the
    protocol's party interface, with the protocol's public transport settings
    (:meth:`transport_options`); ``options`` go to :class:`RayParties`."""
    interface = module.PARTY_INTERFACE
    transport = RAY_TRANSPORTS.get(interface)
    if transport is None:
        raise ValueError(
            f"no Ray transport for the party interface {interface.__name__} of "
            f"{type(module).__name__}; known: {sorted(i.__name__ for i in RAY_TRANSPORTS)}"
        )
    return transport(factory, module.num_parties, **module.transport_options(), **options)
