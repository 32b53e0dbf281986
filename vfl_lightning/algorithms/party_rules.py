"""The rules a party enforces on every call of the server, whatever runtime carries the call (the
local group, a Ray actor, a party program): release rounds strictly increase within each release
stream, state is loaded only to resume and saved only at the current round, a noisy or coded
party never releases a plain embedding, and every received gradient is checked before it is
applied; with its own budget (:class:`~vfl_lightning.algorithms.party_budget.PartyBudget`). A
refusal raises :class:`~vfl_lightning.errors.PartyRefusal`, one line naming the party, the call
and the rule."""

from __future__ import annotations

import math

import numpy as np
import torch

from vfl_lightning.algorithms.party_budget import PartyBudget
from vfl_lightning.algorithms.party_policy import PartyPolicy
from vfl_lightning.errors import PartyRefusal
from vfl_lightning.mechanisms.base import RELEASE_STREAMS, STREAM_SHIFT

STAGE_STREAMS = {
    "train": ("train",),
    "val": ("val", "sanity"),
    "test": ("test",),
    "predict": ("predict",),
}
"""The release streams of each stage (the sanity check releases validation rows)."""


def round_stream(round: int) -> str | None:
    """The release stream whose round ``round`` is (:func:`~vfl_lightning.mechanisms.base.
    release_round`), None for a number outside every stream."""
    stream = int(round) >> STREAM_SHIFT
    return RELEASE_STREAMS[stream] if round >= 0 and stream < len(RELEASE_STREAMS) else None


def mechanism_noise(mechanism) -> float | None:
    """The noise multiplier of a release through ``mechanism`` (None: it adds none; 0 for a
    noisy mechanism that declares none, which no minimum noise accepts)."""
    noise = getattr(mechanism, "noise_multiplier", None)
    if noise is None and getattr(mechanism, "noisy", False):
        return 0.0
    return noise


class ReleaseNoise:
    """What a party's protocol adds to its releases, read from its ``mechanism`` (its
    ``noise_multiplier``; at evaluation only with ``apply_at_eval``) or from Wait-DP's ``dp`` (at
    evaluation only with ``dp.at_eval``) when they are asked, and whether its releases are
    ``coded`` (shares of a sum, never its own embedding: FedVS). None: no noise."""

    def __init__(self, mechanism=None, *, dp=None, coded: bool = False) -> None:
        self.mechanism, self.dp, self.coded = mechanism, dp, bool(coded)

    def at(self, stage: str) -> float | None:
        """The noise multiplier of a release at ``stage`` (None: none)."""
        training = stage == "train"
        if self.dp is not None:
            return self.dp.noise_multiplier if training or self.dp.at_eval else None
        if not training and not getattr(self.mechanism, "apply_at_eval", True):
            return None
        return mechanism_noise(self.mechanism)


class PartyGuard:
    """Party ``party``'s rules (module docstring), the same object wherever the party runs.

    ``noise``: what its protocol adds to its releases (:class:`ReleaseNoise`); ``budget``: its
    :class:`PartyBudget` (a default policy's when None); ``split_sizes``: the rows of each split
    it holds (a release naming other rows is refused; None: not checked, the local group, whose
    batches come from the data module).

    State: the last round released in each release stream, whether it has released anything in
    this process (a load is refused after that), the round it loaded or saved last, and its
    budget's counts (:meth:`state_dict`, saved with the party's state); the protocol counters
    (:meth:`step`) belong to this process."""

    def __init__(
        self,
        party: int,
        noise: ReleaseNoise | None = None,
        budget: PartyBudget | None = None,
        *,
        split_sizes: dict[str, int] | None = None,
    ) -> None:
        self.party = int(party)
        self.noise = noise or ReleaseNoise()
        self.budget = budget or PartyBudget(self.party, PartyPolicy())
        self.split_sizes = split_sizes
        self.ledger = None
        """What a party program counts over every run it served (``runtime=grpc``,
        :class:`~vfl_lightning.runtime.party_ledger.LedgerView`): a release must fit it too."""
        self.last: dict[str, int] = {}
        self.counters: dict[str, int] = {}
        self.released = False
        self.state_round: int | None = None
        self.updates_per_release: int | None = None  # None: not checked (:meth:`check_update`)
        self.updates = 0  # taken since the last training release

    @property
    def policy(self) -> PartyPolicy:
        return self.budget.policy

    def refusal(self, call: str, rule: str) -> PartyRefusal:
        return PartyRefusal(f"party {self.party} refused {call}: {rule}")

    # ----------------------------------------------------------------- releases
    def check_release(
        self,
        call: str,
        stage: str,
        round: int | None,
        rows: np.ndarray | None,
        noise: float | None,
    ) -> None:
        """Refuse a release the protocol or the data does not allow (the budget is asked in
        :meth:`record_release`): a stage it has no stream of, a release without noise where its
        protocol adds noise, any release of a coded party's own embedding, rows outside its
        split, a round outside the stage's streams or not above the stream's last one."""
        if stage not in STAGE_STREAMS:
            raise self.refusal(call, f"it releases rows of {tuple(STAGE_STREAMS)}, not {stage!r}")
        if self.noise.coded:
            raise self.refusal(
                call,
                "a coded party releases only coded shares of the sum, never its own embedding",
            )
        if noise is None and self.noise.at(stage) is not None:
            raise self.refusal(
                call,
                f"a noisy party releases its {stage} rows only with its noise (a release round "
                "is required): it sends no clean embedding",
            )
        self.check_rows(call, stage, rows)
        if round is not None:
            self.check_round(call, stage, round)

    def check_rows(self, call: str, stage: str, rows: np.ndarray | None) -> None:
        size = None if self.split_sizes is None else self.split_sizes.get(stage)
        if size is None or rows is None or len(rows) == 0:
            return
        if size == 0:
            raise self.refusal(
                call,
                f"it holds no {stage} rows yet (a party holds rows only once the sample alignment "
                "has run, and releases none before)",
            )
        if int(rows.min()) < 0 or int(rows.max()) >= size:
            raise self.refusal(call, f"its {stage} split has rows 0..{size - 1}, got others")

    def check_round(self, call: str, stage: str, round: int) -> str:
        """The stream of ``round``, which must be one of ``stage``'s and above its last round."""
        if stage not in STAGE_STREAMS:
            raise self.refusal(call, f"it releases rows of {tuple(STAGE_STREAMS)}, not {stage!r}")
        if isinstance(round, bool) or not isinstance(round, int | np.integer):
            raise self.refusal(call, f"a release round is an integer, got {round!r}")
        stream = round_stream(int(round))
        if stream not in STAGE_STREAMS[stage]:
            raise self.refusal(
                call,
                f"a {stage} release takes a round of its {'/'.join(STAGE_STREAMS[stage])} "
                f"stream, got round {round} ({stream or 'no'} stream)",
            )
        last = self.last.get(stream)
        if last is not None and round <= last:
            raise self.refusal(
                call,
                f"release rounds strictly increase within each stream: its last {stream} "
                f"release was round {last}, got round {round}",
            )
        return stream

    def check_budget(self, call, stage, rows, noise) -> None:
        """Its budget's refusal of the release (then its program's ledger's, where it has one),
        before the message leaves the party."""
        self.budget.check(call, stage, rows, noise)
        if self.ledger is not None:
            self.ledger.check(call, stage, rows, noise)

    def record_release(self, stage, round, rows, noise) -> None:
        """Count a release its checks allowed; its round becomes the stream's last."""
        self.budget.record(stage, rows, noise)
        if self.ledger is not None:
            self.ledger.record(stage, rows, noise)
        if round is not None:
            self.last[round_stream(int(round))] = int(round)
        if stage == "train":
            self.updates = 0
        self.released = True

    def commit(self, call, stage, round, rows, noise) -> None:
        """:meth:`check_budget` then :meth:`record_release` of a release :meth:`check_release`
        allowed and the party computed (a release whose computation failed in between is
        neither counted nor its round used)."""
        self.check_budget(call, stage, rows, noise)
        self.record_release(stage, round, rows, noise)

    def coded_release(self, call: str, stage: str, rows: np.ndarray | None) -> None:
        """A coded party's share of a decoded sum over ``rows`` (no noise): its budget admits it."""
        self.check_rows(call, stage, rows)
        self.commit(call, stage, None, rows, None)

    def check_update(self, call: str, fresh: bool) -> None:
        """With ``updates_per_release`` set (a party program: its protocol's, from its own file),
        a training release takes at most that many updates, the first with its gradient, then
        local steps (``fresh``, FedBCD's Q − 1): a repeated call cannot step the model more."""
        limit = self.updates_per_release
        if limit is None:
            return
        if fresh and self.updates == 0:
            raise self.refusal(
                call,
                "a local step (fresh) follows the update with the gradient its training release "
                "received, not before it",
            )
        if self.updates >= limit:
            raise self.refusal(
                call,
                f"it takes at most {limit} update(s) per training release (its protocol's "
                f"local steps, from its own configuration), this would be update {self.updates + 1}",
            )

    def count_update(self) -> None:
        self.updates += 1

    def step(self, call: str, counter: str, value: int) -> None:
        """A protocol counter of this process (an exchange number, which the server's process
        numbers afresh) that must strictly increase."""
        last = self.counters.get(counter)
        if last is not None and value <= last:
            raise self.refusal(
                call, f"{counter} numbers strictly increase: its last was {last}, got {value}"
            )
        self.counters[counter] = int(value)

    def restart(self, stage: str, release: int) -> None:
        """A new evaluation of ``stage`` whose first release is round ``release``: a round of
        one of the stage's streams above every round released there (a restart never replays an
        evaluation's noise); its releases start at ``release``."""
        stream = self.check_round("restart_stream", stage, release)
        self.last[stream] = int(release) - 1

    # ----------------------------------------------------------------- state
    def check_load(self, call: str = "load_state") -> None:
        if self.released:
            raise self.refusal(
                call,
                "it loads state only to resume, before its first release (a loaded state "
                "would replay the noise of releases it already made)",
            )

    def check_save(self, round: int) -> None:
        """A save at the party's current round only: one past its last training release where it
        releases at training rounds; otherwise not before the round it loaded or saved last."""
        if isinstance(round, bool) or not isinstance(round, int | np.integer) or round < 0:
            raise self.refusal("save_state", f"a round is an integer >= 0, got {round!r}")
        last = self.last.get("train")
        if last is not None and round != last + 1:
            raise self.refusal(
                "save_state",
                f"it saves its state at its current round {last + 1} (its last training "
                f"release was round {last}), got round {round}",
            )
        if last is None and self.state_round is not None and round < self.state_round:
            raise self.refusal(
                "save_state",
                f"its state is at round {self.state_round} or later, got round {round}",
            )
        self.state_round = int(round)

    def state_dict(self) -> dict:
        return {
            "last": dict(self.last),
            "round": self.state_round,
            "budget": self.budget.state_dict(),
        }

    def load_state_dict(self, state: dict | None) -> None:
        """Continue from a saved state (none: a state written before the party kept one)."""
        if state is None:
            return
        self.last = {key: int(value) for key, value in state["last"].items()}
        self.state_round = None if state["round"] is None else int(state["round"])
        self.budget.load_state_dict(state["budget"])

    # ----------------------------------------------------------------- received values
    def check_lr_factor(self, factor) -> None:
        """A learning-rate factor in (0, 1] (the FedBCD schedules only lower the rate)."""
        if not (isinstance(factor, int | float) and 0 < factor <= 1):
            raise self.refusal(
                "set_lr_factor", f"a learning-rate factor is in (0, 1], got {factor!r}"
            )

    def check_mu(self, mu) -> None:
        if not (isinstance(mu, int | float) and math.isfinite(mu) and mu >= 0):
            raise self.refusal(
                "apply_gradient", f"a proximal weight mu is a finite number >= 0, got {mu!r}"
            )


def release_rows(idx: torch.Tensor | None) -> np.ndarray | None:
    """A batch's sample indices as the int64 array the budget counts (None: unnamed rows)."""
    if idx is None:
        return None
    if idx.requires_grad or not idx.is_cpu:
        idx = idx.detach().to("cpu")
    rows = idx.numpy()
    return rows if rows.dtype == np.int64 and rows.ndim == 1 else rows.astype(np.int64).reshape(-1)
