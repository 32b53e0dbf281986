"""The sample alignment under ``runtime=ray``: the PSI call of a party actor (its
:class:`~vfl_lightning.data.psi.PsiParty`, scalar and ids, stay in the actor) and the server's
side, which runs the same driver as every runtime with the actors as its transport."""

from __future__ import annotations

import torch

from vfl_lightning.data.alignment import AlignmentReport, align_with_parties
from vfl_lightning.data.psi import PsiError


class PsiActorMethods:
    """A party actor's PSI call (mixed into ``PartyActor``: ``alignment``, ``table``,
    ``aligned_features``, ``own``, ``party``, ``device`` and ``unusable`` are the actor's)."""

    def psi(self, message: bytes) -> bytes:
        """The reply to the label holder's next PSI message (:class:`PsiParty`); a message out
        of order, replayed, of another session or crafted (rows outside the intersection it
        computed, invalid group elements) is refused, one line. Once aligned, the rows the PSI
        chose, in the agreed order, are this party's columns of every split, and its guard admits
        releases of exactly those rows."""
        if self.unusable is not None:
            raise self.unusable
        guard = self.own.guard
        if self.alignment is None:
            raise guard.refusal("psi", "its rows are aligned already, it runs no PSI")
        try:
            reply = self.alignment.respond(message)
        except PsiError as error:
            raise guard.refusal("psi", psi_rule(error, self.party)) from None
        if self.alignment.rows is not None and self.table is not None:
            self.aligned_features = {
                stage: torch.from_numpy(self.table.features[rows]).to(self.device)
                for stage, rows in self.alignment.rows.items()
            }
            guard.split_sizes = {stage: len(rows) for stage, rows in self.alignment.rows.items()}
            self.table = None
        return reply


def psi_rule(error: PsiError, party: int) -> str:
    """The rule a party's PSI refusal names (its text without the leading "party m refuses")."""
    return str(error).removeprefix(f"party {party} refuses ")


class RayAlignment:
    """The server's side of the PSI with the party actors (mixed into ``RayParties``)."""

    def align(self, stage_ids: dict) -> AlignmentReport:
        """The PSI of the label holder (this process: its ids ``stage_ids``, its scalars) with
        every actor; a party's refusal stops the run with that party's one line."""

        def exchange(messages: list[bytes]) -> list[bytes]:
            refs = [a.psi.remote(m) for a, m in zip(self.actors, messages, strict=True)]
            return self._get(refs, "alignment")

        return align_with_parties(stage_ids, exchange, len(self.actors))
