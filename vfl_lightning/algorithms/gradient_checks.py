"""A party's check of the gradients it receives, before it applies them: the shape and dtype of
its embedding, finite values, and each row's L2 norm within its policy's bound (refused, or
clipped with ``policy.large_gradient=clip``); several parties' gradients measured together."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from vfl_lightning.algorithms.party_rules import PartyGuard


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
