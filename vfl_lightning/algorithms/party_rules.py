"""The rules a party enforces on every call of the server, whatever runtime carries the call (the
local group, a Ray actor, a party program): release rounds strictly increase within each release
stream, state is loaded only to resume and saved only at the current round, a noisy or coded
party never releases a plain embedding, and every received gradient is checked before it is
applied; with its own budget (:class:`~vfl_lightning.algorithms.party_budget.PartyBudget`). A
refusal raises :class:`~vfl_lightning.errors.PartyRefusal`, one line naming the party, the call
and the rule."""

from __future__ import annotations

import math
from collections.abc import Sequence

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


def checked_gradients(
    guards: Sequence[PartyGuard],
    gradients: Sequence[torch.Tensor | None],
    embeddings: Sequence[torch.Tensor | None],
    call: str = "apply_gradient",
) -> list[torch.Tensor | None]:
    """Each guard's party received ``gradients[i]`` for its embedding ``embeddings[i]`` (None:
    no gradient for it): refused unless it matches the embedding's shape, is floating point
    (cast to the embedding's dtype, as autograd would) and finite once cast,
    and each row's L2 norm is within the party's ``policy.max_gradient_norm`` (or, with
    ``policy.large_gradient=clip``, the oversized rows are scaled down to it). One host sync for
    every party together (the largest row norm of each, :func:`largest_row_norms`); gradients that
    are the same values (one tensor handed to several parties, as a sum or mean fusion does) are
    measured once. The row norms of a gradient to clip are computed for it alone."""
    present, out = [], list(gradients)
    for index, (guard, gradient, embedding) in enumerate(
        zip(guards, gradients, embeddings, strict=True)
    ):
        if gradient is None:
            continue
        if embedding is None:
            raise guard.refusal(call, "it has no training release awaiting a gradient")
        if not isinstance(gradient, torch.Tensor):
            raise guard.refusal(call, f"a gradient is a tensor, got {type(gradient).__name__}")
        if gradient.shape != embedding.shape or not gradient.is_floating_point():
            raise guard.refusal(
                call,
                f"a received gradient must match its embedding ({tuple(embedding.shape)}, "
                f"floating point), got ({tuple(gradient.shape)}, {gradient.dtype})",
            )
        if gradient.dtype != embedding.dtype:  # as autograd would cast it, checked after
            gradient = out[index] = gradient.to(embedding.dtype)
        if gradient.numel():
            present.append((index, guard, gradient))
    if not present:
        return out
    largest = largest_row_norms([gradient for _, _, gradient in present])
    for (index, guard, gradient), worst in zip(present, largest, strict=True):
        if not math.isfinite(worst):
            raise guard.refusal(call, "a received gradient must be finite, got NaN or infinity")
        bound = guard.policy.max_gradient_norm
        if bound is None or worst <= bound:
            continue
        if guard.policy.large_gradient == "refuse":
            raise guard.refusal(
                call,
                f"a received gradient row has L2 norm {worst:.4g}, above its "
                f"{guard.policy.setting('max_gradient_norm')}",
            )
        rows = row_norms(gradient)
        scale = (bound / rows.clamp_min(torch.finfo(rows.dtype).tiny)).clamp(max=1.0)
        out[index] = gradient * scale.reshape(-1, *([1] * (gradient.dim() - 1)))
    return out


def largest_row_norms(gradients: Sequence[torch.Tensor]) -> list[float]:
    """The largest :func:`row_norms` of each gradient, as floats (one host sync). Each distinct
    view (the same memory, shape, strides, dtype and device hold the same values) is measured
    once; distinct views of one shape, dtype and device (a concatenation's gradient split by
    party) are stacked and measured in one computation, each row's norm over its own values."""
    first = gradients[0]
    if all(gradient is first for gradient in gradients):  # one tensor handed to every party
        return _largest_of_distinct([first]) * len(gradients)
    of_view: dict[tuple, int] = {}
    distinct: list[torch.Tensor] = []
    positions = []
    for gradient in gradients:
        view = (gradient.data_ptr(), gradient.shape, gradient.stride(), gradient.dtype)
        view += (gradient.device,)
        position = of_view.get(view)
        if position is None:
            position = of_view[view] = len(distinct)
            distinct.append(gradient)
        positions.append(position)
    largest = _largest_of_distinct(distinct)
    return [largest[i] for i in positions]


def _largest_of_distinct(distinct: Sequence[torch.Tensor]) -> list[float]:
    """:func:`largest_row_norms` of gradients that are distinct views."""
    first = distinct[0]
    if len(distinct) == 1:
        one_row = first.dim() < 2  # its one row's norm is the norm of all of it
        norms = torch.linalg.vector_norm(first) if one_row else row_norms(first).amax()
        largest = [norms.item()]
    elif all(
        g.shape == first.shape and g.dtype == first.dtype and g.device == first.device
        for g in distinct[1:]
    ):
        rows = first.shape[0] if first.dim() >= 2 else 1
        stacked = torch.stack(distinct).reshape(len(distinct), rows, -1)
        largest = torch.linalg.vector_norm(stacked, dim=2).amax(dim=1).tolist()
    else:
        largest = torch.stack([row_norms(g).amax() for g in distinct]).tolist()
    return largest


def row_norms(gradient: torch.Tensor) -> torch.Tensor:
    """The L2 norm of each row (first dimension) of ``gradient``; a 0- or 1-d one is one row."""
    if gradient.dim() < 2:
        return torch.linalg.vector_norm(gradient.reshape(1, -1), dim=1)
    return torch.linalg.vector_norm(gradient.reshape(gradient.shape[0], -1), dim=1)


def release_rows(idx: torch.Tensor | None) -> np.ndarray | None:
    """A batch's sample indices as the int64 array the budget counts (None: unnamed rows)."""
    if idx is None:
        return None
    if idx.requires_grad or not idx.is_cpu:
        idx = idx.detach().to("cpu")
    rows = idx.numpy()
    return rows if rows.dtype == np.int64 and rows.ndim == 1 else rows.astype(np.int64).reshape(-1)
