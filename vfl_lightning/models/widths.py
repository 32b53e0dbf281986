"""Layer widths from a config, checked before torch sees them: one error naming the key, the value
and the allowed range instead of torch's "negative dimension"."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def _is_width(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


def check_width(key: str, value) -> int:
    """``value`` as a layer width: an integer >= 1, or a ValueError naming ``key``."""
    if not _is_width(value):
        raise ValueError(f"{key} must be an integer >= 1, got {value!r}")
    return value


def check_widths(key: str, values, count: int | None = None) -> list[int]:
    """``values`` as a list of layer widths (exactly ``count`` of them when given)."""
    widths = list(values) if isinstance(values, Sequence) and not isinstance(values, str) else None
    if widths is None or not all(_is_width(v) for v in widths) or count not in (None, len(widths)):
        amount = "a list of" if count is None else f"{count}"
        raise ValueError(
            f"{key} must be {amount} integers >= 1, got {widths if widths is not None else values!r}"
        )
    return widths


def check_count(key: str, value, minimum: int = 1) -> int:
    """``value`` as a layer count: an integer >= ``minimum``, or a ValueError naming ``key``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value!r}")
    return value


def depth_widths(key: str, widths, num_layers, fixed: int = 0) -> list[int]:
    """The widths of a stack of layers from a config's width list and its depth knob
    ``party.num_layers`` (which also counts ``fixed`` layers of no configured width, e.g. an
    output layer): the list itself when ``num_layers`` is None, else ``num_layers - fixed`` widths
    taken from the front of the list, its last width repeated when the list is shorter.
    ``widths=[64]`` with 3 layers gives ``[64, 64, 64]``."""
    widths = check_widths(key, widths)
    if num_layers is None:
        return widths
    count = check_count("party.num_layers", num_layers)
    needed = max(count - fixed, 0)
    if needed > 0 and not widths:
        raise ValueError(f"{key} must name at least one width for party.num_layers={count}")
    return [widths[min(i, len(widths) - 1)] for i in range(needed)]


def over_rows(fused: torch.Tensor, model: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """``model`` on ``fused`` (..., B, in_features): stacked batches (a zeroth-order query's
    candidates, shape (K, B, in)) one by one, each its own batch (its own batch-norm statistics
    in training mode), the outputs stacked again."""
    if fused.dim() <= 2:
        return model(fused)
    return torch.stack([over_rows(batch, model) for batch in fused])
