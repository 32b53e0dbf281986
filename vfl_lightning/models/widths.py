"""Layer widths from a config, checked before torch sees them: one error naming the key, the value
and the allowed range instead of torch's "negative dimension"."""

from __future__ import annotations

from collections.abc import Sequence


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
