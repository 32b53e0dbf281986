"""The start of a ``runtime=grpc`` run: the server proposes what will run (protocol, mechanism,
model, optimizer, every party's input shape and width, where seeds come from), and each party
checks the proposal against its own configuration (which rows train is the PSI's, after it). A mismatch
is one line, which the party prints and returns, and the server prints too."""

from __future__ import annotations

import math

from vfl_lightning.runtime.grpc_channel import ProposalRefused
from vfl_lightning.runtime.party_config import PartyConfig
from vfl_lightning.runtime.party_state import RUN_KEY

FORMAT = "vfl_lightning proposal"
VERSION = 1
IGNORED_MECHANISM_KEYS = ("seed",)
"""Mechanism settings a party does not compare: ``seed`` derives the simulation's mask seeds,
which parties replace by their certified key agreement."""


def first_difference(ours, theirs, prefix: str):
    """(key, our value, their value) of the first setting where two config nodes differ, or
    None. Integers and floats of equal value are equal."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in sorted(set(ours) | set(theirs), key=str):
            found = first_difference(ours.get(key), theirs.get(key), f"{prefix}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(ours, list | tuple) and isinstance(theirs, list | tuple):
        if len(ours) != len(theirs):
            return prefix, ours, theirs
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            found = first_difference(a, b, f"{prefix}[{i}]")
            if found is not None:
                return found
        return None
    numbers = (int, float)
    if (
        isinstance(ours, numbers)
        and isinstance(theirs, numbers)
        and not isinstance(ours, bool)
        and not isinstance(theirs, bool)
    ):
        same = ours == theirs or (math.isnan(ours) and math.isnan(theirs))
        return None if same else (prefix, ours, theirs)
    return None if ours == theirs else (prefix, ours, theirs)


def without(node, keys):
    """``node`` without ``keys`` (anything but a dict as it is, for the comparison to name)."""
    return {k: v for k, v in node.items() if k not in keys} if isinstance(node, dict) else node


def sizes(value) -> bool:
    """Whether ``value`` is a list of integers >= 1 (a shape, or the widths)."""
    return isinstance(value, list) and all(
        isinstance(size, int) and not isinstance(size, bool) and size >= 1 for size in value
    )


def check_proposal(
    config: PartyConfig,
    proposal: dict,
    *,
    settings: tuple[str, ...],
    shape: tuple[int, ...],
) -> None:
    """Refuse (:class:`ProposalRefused`, one line naming the party, the setting, both values and
    the file) a proposal that does not match party ``config``: its index, the protocol's
    ``settings`` (the keys of ``config.protocol`` the protocol class declares a party agrees
    to), model, optimizer and mechanism, where its seeds come from and its input ``shape``."""
    party = config.party

    def refuse(what: str) -> ProposalRefused:
        return ProposalRefused(f"party {party} refuses the proposal: {what} ({config.path})")

    if not isinstance(proposal, dict) or proposal.get("format") != FORMAT:
        raise refuse(f"it is not a {FORMAT!r}")
    if proposal.get("version") != VERSION:
        raise refuse(f"version {proposal.get('version')!r}, this party reads {VERSION}")
    shapes, widths = proposal.get("party_shapes"), proposal.get("widths")
    if not (
        isinstance(shapes, list)
        and all(sizes(shape) for shape in shapes)
        and sizes(widths)
        and len(widths) == len(shapes)
    ):
        raise refuse(
            "its party_shapes and widths are not one input shape (sizes >= 1) and one width "
            "(>= 1) per party"
        )
    if not (isinstance(proposal.get("run"), str) and RUN_KEY.fullmatch(proposal["run"])):
        raise refuse(f"its run key {proposal.get('run')!r} is not 32 lowercase hex digits")
    if proposal.get("party") != party:
        raise refuse(
            f"it addresses party {proposal.get('party')!r} at this address, this is party {party}"
        )
    proposed = proposal.get("protocol") or {}
    own = {key: config.protocol.get(key) for key in settings}
    theirs = {key: proposed.get(key) for key in settings}
    nodes = (
        ("protocol", own, theirs),
        ("model", config.model, proposal.get("model")),
        ("optimizer", config.optimizer, proposal.get("optimizer")),
        (
            "mechanism",
            without(config.mechanism, IGNORED_MECHANISM_KEYS),
            without(proposal.get("mechanism"), IGNORED_MECHANISM_KEYS),
        ),
    )
    for name, ours, proposed_node in nodes:
        found = first_difference(ours, proposed_node, name)
        if found is not None:
            key, mine, other = found
            raise refuse(f"{key} is {other!r} in the proposal, {mine!r} in its configuration")
    if proposal.get("party_seeds") != config.seeds:
        raise refuse(
            f"runtime.party_seeds={proposal.get('party_seeds')!r}, its configuration has "
            f"seeds={config.seeds!r}"
        )
    if config.seeds == "derived" and proposal.get("seed") != config.seed:
        raise refuse(
            f"seed={proposal.get('seed')!r} in the proposal, seed={config.seed!r} in its "
            "configuration (seeds=derived reproduces one run's seed)"
        )
    if not 0 <= party < len(shapes) or tuple(shapes[party]) != tuple(shape):
        theirs_shape = shapes[party] if 0 <= party < len(shapes) else None
        raise refuse(f"input shape {theirs_shape!r} in the proposal, {list(shape)} in its data")
