"""One run of a party program under ``runtime=grpc`` (:class:`PartySession`): built from the
party's own configuration once it accepted the server's proposal, it wraps one
:class:`~vfl_lightning.algorithms.party.Party` (the class every runtime's parties are) and
answers the calls of its protocol family, each through the party's
:class:`~vfl_lightning.algorithms.party_rules.PartyGuard` (its protocol's rules and its own
policy's budget, as every runtime's parties). Keys: a fresh X25519 key per run, signed with the
party's certificate key; the peers' keys are verified against the party's own CA and the names
``party-<m>`` before any pair seed is derived. Data: the rows of the party's own file, with
their ids, in its own order; the PSI (``Psi``: bytes in, bytes out, the party's scalar and ids
staying here) aligns them with the label holder's before any embedding. State: the party's own files in its own
``state_dir`` (:mod:`~vfl_lightning.runtime.party_state`), never a file the server names."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import torch
from hydra.utils import get_class

from vfl_lightning.algorithms.parties import PartyGenerators, private_seed
from vfl_lightning.algorithms.party import Party
from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.algorithms.party_rules import (
    PartyGuard,
    ReleaseNoise,
    mechanism_noise,
    release_rows,
)
from vfl_lightning.data.psi import PsiError, PsiParty
from vfl_lightning.errors import PartyRefusal
from vfl_lightning.mechanisms.certificates import (
    CertifiedKey,
    Credentials,
    KeyCertificationError,
    certified_pair_seeds,
    certify_key,
)
from vfl_lightning.mechanisms.keys import fresh_private_key, pair_channel_key, public_bytes
from vfl_lightning.runtime.party_config import PartyConfig
from vfl_lightning.runtime.party_state import (
    check_run_key,
    load_party_state,
    party_state_path,
    resumable_rounds,
    resume_refusal,
    save_party_state,
)
from vfl_lightning.runtime.party_trust import check_agreement
from vfl_lightning.wire.codecs import Codec, decode_form
from vfl_lightning.wire.frames import FrameError

SPLITS = ("train", "val", "test")
BEFORE_ALIGNMENT = "it releases nothing before the PSI aligned its rows (Psi)"
DOWNLINK_FORMS = ("dense", "topk")
"""The gradient forms a party decodes (the downlink codecs: float32, or top-k entries)."""


@dataclass
class OwnData:
    """A party's data file: the sample ids of the rows it holds and their columns (a float32
    tensor, one row per id), in its own order."""

    ids: object
    features: torch.Tensor

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.features.shape[1:])


class PartySession:
    """Party ``config.party``'s side of one run: its columns, model, optimizer, mechanism and
    generators, built as the proposal and its own configuration agree.

    Initial parameters: with ``seeds: derived`` as the local run builds them (its seed, every
    party model of the proposal's shapes in order, its own kept), so the run can be compared bit
    for bit; with ``seeds: private`` its own model alone, from entropy drawn here (then torch's
    global generator is reseeded from it too). A masking mechanism holds no pair seed before the
    certified key agreement, so the party sends nothing masked before it."""

    def __init__(
        self, config: PartyConfig, credentials: Credentials, data: OwnData, proposal: dict
    ) -> None:
        self.config, self.credentials, self.party = config, credentials, config.party
        self.session = secrets.token_hex(16)
        self.table: OwnData | None = data
        self.aligned_features: dict[str, torch.Tensor] | None = None
        self.alignment = PsiParty(data.ids, config.party)
        self.run = check_run_key(str(proposal.get("run", "")))
        shapes = [tuple(shape) for shape in proposal["party_shapes"]]
        factory = PartyFactory(
            {
                "seed": config.seed or 0,
                "data": {},
                "party": config.model,
                "mechanism": config.mechanism,
                "optimizer": config.optimizer,
            }
        )
        derived = config.seeds == "derived"
        if derived:
            import lightning as L

            L.seed_everything(config.seed, workers=True, verbose=False)
            model = factory.party_models(shapes)[self.party]
        else:
            torch.manual_seed(private_seed())
            model = factory.complete("party", input_shape=shapes[self.party])
        optimizer = factory.optimizer()(model.parameters())
        self.mechanism = factory.mechanism(len(shapes))
        if self.mechanism.uses_pair_masks:
            self.mechanism.set_pair_seeds({})
        generators = PartyGenerators(config.seed or 0, self.party, party_seeds=config.seeds)
        budget = PartyBudget(
            self.party, config.policy, self.mechanism, embedding_dim=model.embedding_dim
        )
        sizes = {stage: 0 for stage in SPLITS}  # none before the PSI aligned its rows
        guard = PartyGuard(self.party, self.release_noise(), budget, split_sizes=sizes)
        protocol = get_class(config.protocol["_target_"])
        guard.updates_per_release = protocol.party_updates_per_release(dict(config.protocol))
        self.own = Party(self.party, model, generators, optimizer, guard)
        if not derived:
            torch.manual_seed(private_seed())
        self.width = int(model.embedding_dim)
        self.last_gradient: torch.Tensor | None = None
        self.key = fresh_private_key()
        self.channel_keys: dict[int, bytes] = {}
        self.agreed = False

    def refuse(self, rule: str) -> PartyRefusal:
        return PartyRefusal(f"party {self.party} refuses: {rule}")

    @property
    def features(self) -> dict[str, torch.Tensor]:
        """Its columns of every split, once the PSI aligned them: before, every call that reads
        them is refused."""
        if self.aligned_features is None:
            raise self.refuse(BEFORE_ALIGNMENT)
        return self.aligned_features

    def release_noise(self) -> ReleaseNoise:
        """What its protocol adds to its releases (its guard refuses a release without it):
        its mechanism's noise."""
        return ReleaseNoise(self.mechanism)

    # ----------------------------------------------------------------- key agreement
    def publish_key(self, fields: dict) -> dict:
        certified = certify_key(
            self.credentials,
            run_id=fields["run_id"],
            party=self.party,
            public_key=public_bytes(self.key),
        )
        return {
            "public_key": certified.public_key,
            "certificate": certified.certificate,
            "signature": certified.signature,
        }

    def agree(self, fields: dict) -> dict:
        """Verify every relayed key against this party's CA and the peer's name, then derive the
        pair seeds and the pair channel keys: once per session, one key per party of the
        proposal (:func:`check_agreement`)."""
        check_agreement(self.own.guard, self.agreed, fields["keys"], self.mechanism.num_parties)
        relayed = []
        for entry in fields["keys"]:
            if not (isinstance(entry, list) and len(entry) == 4):
                raise self.refuse("the relayed keys are not [party, key, certificate, signature]")
            party, public, certificate, signature = entry
            if not (
                isinstance(party, int)
                and all(isinstance(part, bytes) for part in (public, certificate, signature))
            ):
                raise self.refuse("the relayed keys are not [party, key, certificate, signature]")
            relayed.append(CertifiedKey(party, public, certificate, signature))
        try:
            seeds = certified_pair_seeds(
                self.key, self.party, relayed, run_id=fields["run_id"], ca=self.credentials.ca
            )
        except KeyCertificationError as error:
            raise self.refuse(f"the key agreement: {error}") from None
        if self.mechanism.uses_pair_masks:
            self.mechanism.set_pair_seeds(seeds)
        self.channel_keys = {
            m: pair_channel_key(self.key, key.public_key, *sorted((self.party, m)))
            for m, key in enumerate(relayed)
            if m != self.party
        }
        self.agreed = True
        return {}

    # ----------------------------------------------------------------- sample alignment
    def psi(self, fields: dict) -> dict:
        """The reply to the label holder's next PSI message; a message out of order, replayed,
        of another session or crafted (rows outside the intersection it computed, invalid group
        elements) is refused, one line. Once aligned, the rows the PSI chose, in the agreed
        order, are this party's columns of every split, and its guard admits releases of
        exactly those rows."""
        try:
            reply = self.alignment.respond(fields["message"])
        except PsiError as error:
            raise self.refuse(f"the alignment: {error}") from None
        if self.alignment.rows is not None and self.table is not None:
            features = self.table.features
            self.aligned_features = {
                stage: features[torch.from_numpy(rows)]
                for stage, rows in self.alignment.rows.items()
            }
            self.own.guard.split_sizes = {
                stage: len(rows) for stage, rows in self.alignment.rows.items()
            }
            self.table = None
        return {"message": reply}

    # ----------------------------------------------------------------- every protocol
    def indices(self, idx) -> torch.Tensor:
        """Row indices as the server must send them, a 1-d int64 tensor: anything else is
        refused before a rule or the budget reads them."""
        if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int64 or idx.dim() != 1:
            raise self.refuse("row indices are a 1-d int64 tensor")
        return idx

    def rows(self, stage: str, idx) -> torch.Tensor:
        if stage not in SPLITS:
            raise self.refuse(f"it embeds rows of {SPLITS}, not {stage!r}")
        features = self.features[stage]
        idx = self.indices(idx)
        if len(idx) and (int(idx.min()) < 0 or int(idx.max()) >= len(features)):
            raise self.refuse(f"row indices lie in [0, {len(features)}) for the {stage} split")
        return features[idx]

    def encoded(self, message: torch.Tensor) -> list:
        """The message in its mechanism's uplink form (ring elements packed at their width)."""
        if message.is_floating_point():
            return Codec().encode(message)
        return self.mechanism.uplink_codec().encode(message)

    def send(self, fields: dict) -> dict:
        """This party's release of rows ``idx`` of the stage, encoded by its mechanism at release
        ``round``, as its guard allows (``round`` None, the plain embedding, only where its
        protocol adds no noise at that stage; rounds strictly increase per stream)."""
        stage, round, idx = fields["stage"], fields["round"], fields["idx"]
        noise = None if round is None else mechanism_noise(self.mechanism)
        out, commit = self.release("send", idx, stage, round, noise)
        if round is not None:
            generator = self.own.generators.get(stage)
            out = self.mechanism.encode_party(self.party, out, generator=generator, round=round)
        commit()
        return {"message": self.encoded(out)}

    def release(self, call: str, idx, stage: str, round, noise):
        """(its embedding of rows ``idx`` of ``stage``, what records the release): its guard
        checks the release first; a training forward is kept for its update once recorded (the
        same steps as a Ray actor's release)."""
        rows = release_rows(self.indices(idx))
        if stage not in SPLITS:
            raise self.refuse(f"it embeds rows of {SPLITS}, not {stage!r}")
        if self.aligned_features is None:
            raise self.refuse(BEFORE_ALIGNMENT)
        self.own.guard.check_release(call, stage, round, rows, noise)
        x = self.rows(stage, idx)
        training = stage == "train"
        self.own.model.train(training)
        if training:
            h = self.own.forward(x)
            out = self.own.training_release(idx, h.detach())
        else:
            out = self.own.embedding(x)

        def commit() -> None:
            self.own.guard.commit(call, stage, round, rows, noise)
            if training:
                self.own.keep(x, h)

        return out, commit

    def gradient(self, form, call: str = "apply_gradient") -> torch.Tensor:
        """A received gradient decoded in this process: the kept message's shape (a top-k form
        of another shape is refused before it is expanded), floating point; its guard checks
        the rest where it is applied."""
        guard = self.own.guard
        if self.own.x is None:
            raise guard.refusal(call, "it has no training release awaiting a gradient")
        expected = (len(self.own.x), self.width)
        declared = form[1] if isinstance(form, list) and form[:1] == ["topk"] else None
        try:
            if declared is not None and declared != list(expected):
                raise FrameError(f"a topk gradient of shape {declared}")
            gradient = decode_form(form, DOWNLINK_FORMS)
        except FrameError as error:
            raise guard.refusal(
                call, f"a malformed gradient for its embedding of shape {expected}: {error}"
            ) from None
        if tuple(gradient.shape) != expected or not gradient.is_floating_point():
            raise guard.refusal(
                call,
                f"a received gradient must match its embedding ({expected}, floating point), "
                f"got ({tuple(gradient.shape)}, {gradient.dtype})",
            )
        return gradient

    def restart_stream(self, fields: dict) -> dict:
        """A new evaluation of ``stage`` from release ``release``: its guard refuses one at or
        below the stream's last round (no evaluation noise is replayed)."""
        self.own.guard.restart(fields["stage"], fields["release"])
        self.own.generators.restart(fields["stage"], fields["release"])
        return {}

    def digest(self, fields: dict) -> dict:
        return {"digest": self.own.digest()}

    def privacy_spent(self, fields: dict) -> dict:
        """What it counted of its own releases (its feature ε at its policy's δ, its
        most-released rows): numbers, no row."""
        return {"spent": [[key, value] for key, value in self.own.guard.budget.spent().items()]}

    def save_state(self, fields: dict) -> dict:
        """Its state (model, optimizer, generators, guard) for the server checkpoint of
        ``round``, its current round only, in its own state directory."""
        self.own.guard.check_save(fields["round"])
        save_party_state(
            self.config.state_dir, self.party, self.run, fields["round"], self.own.state_dict()
        )
        if self.own.guard.ledger is not None:
            self.own.guard.ledger.save()
        return {}

    def load_state(self, fields: dict) -> dict:
        """Resume from the state it saved in its own directory for ``round`` of run ``run``:
        before its first release, and only the newest round it saved for that run or the one
        before it (:func:`resumable_rounds`: the server's checkpoint of a run stopped between
        the parties' save and its own)."""
        self.own.guard.check_load()
        root = self.config.state_dir
        try:
            run = check_run_key(fields["run"])
            rounds = resumable_rounds(root, self.party, run)
            path = party_state_path(root, self.party, run, fields["round"])
        except ValueError as error:
            return {"problem": f"party {self.party} refuses to resume: {error}"}
        if rounds and path.is_file() and int(fields["round"]) not in rounds:
            raise self.own.guard.refusal("load_state", resume_refusal(run, rounds, fields["round"]))
        state, problem = load_party_state(root, self.party, run, fields["round"])
        if state is not None:
            self.own.load_state_dict(state)
            self.run = run
        return {"problem": problem}

    # ----------------------------------------------------------------- the synchronous family
    def apply_gradient(self, fields: dict) -> dict:
        """The update with the gradient received; ``["cached"]``: the last one it received again
        (FedBCD's local steps, ``fresh``: a fresh forward of the kept input)."""
        form, fresh = fields["gradient"], fields["fresh"]
        if form == ["cached"]:
            if not fresh or self.last_gradient is None:
                raise self.refuse("a cached gradient outside a local step after an exchange")
            gradient = self.last_gradient
        else:
            gradient = self.last_gradient = self.gradient(form)
        self.own.apply_gradient(gradient, fresh=fresh, mu=fields["mu"])
        return {}

    def set_anchor(self, fields: dict) -> dict:
        self.own.set_anchor()
        return {}

    def set_lr_factor(self, fields: dict) -> dict:
        self.own.set_lr_factor(fields["factor"])
        return {}

    METHODS = {
        "PublishKey": "publish_key",
        "Agree": "agree",
        "Psi": "psi",
        "Send": "send",
        "RestartStream": "restart_stream",
        "Digest": "digest",
        "PrivacySpent": "privacy_spent",
        "SaveState": "save_state",
        "LoadState": "load_state",
        "ApplyGradient": "apply_gradient",
        "SetAnchor": "set_anchor",
        "SetLrFactor": "set_lr_factor",
    }
    """The calls of a session (the synchronous family's), each to the method of that name."""
    SYNC_UPDATES = ("ApplyGradient", "SetAnchor", "SetLrFactor")
    """The synchronous family's updates: another family's session does not answer them."""
