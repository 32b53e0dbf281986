"""A partition's options: checked against its function's signature and annotations, and written
back as the config node they came from. Standard library only."""

from __future__ import annotations

import functools
import inspect
import typing

CONTEXT = ("seed", "x_train", "y_train", "columns", "view_sizes")
"""What the data module passes a partition besides its options, when its signature takes it."""


def check_options(function: typing.Callable, options: dict) -> None:
    """Every option is a keyword parameter of ``function`` (not one the data module passes) and
    of the type its annotation names, when that is a plain type (an int for a float too)."""
    name = getattr(function, "__name__", repr(function))
    try:
        parameters = inspect.signature(function).parameters
        hints = typing.get_type_hints(function)
    except (TypeError, ValueError, NameError):
        parameters, hints = {}, {}
    keywords = [p for p in list(parameters)[2:] if p not in CONTEXT]
    for key, value in options.items():
        if key in ("feature_shape", "num_parties") or key in CONTEXT or key not in keywords:
            raise ValueError(
                f"data.partition.{key} is not an option of {name} (it takes {keywords or 'none'})"
            )
        allowed = _plain_types(hints.get(key))
        if allowed and not _is_instance(value, allowed):
            wanted = " or ".join(TYPE_WORDS.get(t, t.__name__) for t in allowed)
            raise ValueError(f"data.partition.{key} must be {wanted} for {name}, got {value!r}")


def _plain_types(hint) -> tuple[type, ...]:
    """The plain types an annotation names (``float``, ``int | None``, ...); () for others."""
    if hint is None:
        return ()
    members = (
        typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, _UnionType) else (hint,)
    )
    plain = (bool, int, float, str, list, dict, type(None))
    if all(member in plain for member in members):
        return tuple(members)
    return ()


_UnionType = type(int | None)
TYPE_WORDS = {
    float: "a number",
    int: "an integer",
    str: "a string",
    bool: "true or false",
    list: "a list",
    dict: "a mapping",
    type(None): "null",
}


def _is_instance(value, allowed: tuple[type, ...]) -> bool:
    if isinstance(value, bool):
        return bool in allowed
    if isinstance(value, int) and float in allowed:
        return True
    if isinstance(value, (list, tuple)) and (list in allowed):
        return True
    return isinstance(value, allowed)


def partition_setting(spec):
    """``data.partition`` as its config writes it (a name, or a node's ``_target_`` and options),
    also when Hydra has made the node a ``functools.partial``: what a manifest records."""
    if isinstance(spec, functools.partial):
        function = spec.func
        return {"_target_": f"{function.__module__}.{function.__qualname__}", **spec.keywords}
    if isinstance(spec, typing.Mapping):
        return {k: v for k, v in spec.items() if k != "_partial_"}
    return spec
