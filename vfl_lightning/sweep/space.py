"""A search space written as Hydra overrides, as Optuna distributions: ``interval(a, b)`` a float
in [a, b] (``tag(log, interval(a, b))`` on a log scale), ``range(a, b[, s])`` of integers an
integer in [a, b) with step s (of floats: one of its values), ``choice(x, y, ...)`` one of the
values; any other override is a fixed value every trial gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import (
    ChoiceSweep,
    IntervalSweep,
    Override,
    RangeSweep,
    Transformer,
)
from hydra.errors import HydraException
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from vfl_lightning.errors import ConfigError

TAGS = {"log"}
"""The only tag a search dimension takes (``tag(log, interval(a, b))``)."""


@dataclass
class SearchSpace:
    """What every trial is made of: the searched overrides (name as written, ``+`` included, to
    its distribution) and the fixed overrides (their text, as written)."""

    distributions: dict[str, BaseDistribution] = field(default_factory=dict)
    fixed: dict[str, str] = field(default_factory=dict)

    def overrides(self, params: dict[str, Any]) -> list[str]:
        """A trial's overrides: each searched name with its value, then the fixed ones."""
        searched = [f"{name}={override_text(params[name])}" for name in self.distributions]
        return [*searched, *self.fixed.values()]

    def description(self) -> dict[str, str]:
        """``{name: what}`` of every override: its distribution (as Optuna writes it) or its
        fixed text; two workers of one study must agree on it."""
        described = {name: repr(dist) for name, dist in self.distributions.items()}
        described.update(self.fixed)
        return dict(sorted(described.items()))


def override_text(value: Any) -> str:
    """A value as Hydra's override grammar reads it back (``true``, ``null``, ``0.1``, ``a``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


def search_space(params: dict[str, Any] | None, arguments: list[str]) -> SearchSpace:
    """The space of ``hydra.sweeper.params`` (``{key: override value}``) and the command line's
    overrides (``arguments``, which win over ``params`` for the same key). Raises
    :class:`ConfigError` naming the override that is not a search dimension Optuna can take."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()]
    lines += list(arguments)
    parser = OverridesParser.create()
    chosen: dict[str, Override] = {}
    for line in lines:
        try:
            (override,) = parser.parse_overrides([line])
        except HydraException as error:
            first = str(error).splitlines()[0]
            raise ConfigError(
                f"{line} is not a Hydra override ({first}); write key=value, or a search "
                "dimension: interval(a,b), tag(log,interval(a,b)), range(a,b[,step]), choice(x,y,...)"
            ) from None
        chosen[_name_without_prefix(override)] = override
    space = SearchSpace()
    for override in chosen.values():
        name = override.get_key_element()
        if override.is_sweep_override():
            space.distributions[name] = distribution(override)
        else:
            space.fixed[name] = override.input_line or ""
    return space


def _name_without_prefix(override: Override) -> str:
    package = f"@{override.package}" if override.package else ""
    return f"{override.key_or_group}{package}"


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override (see the module's docstring)."""
    value = override.value()
    line = override.input_line
    tags = set(getattr(value, "tags", set()) or set())
    if tags - TAGS:
        raise ConfigError(
            f"{line}: unknown tag {sorted(tags - TAGS)}; the only tag is log, as in "
            "tag(log,interval(0.001,0.1))"
        )
    if isinstance(value, IntervalSweep):
        low, high = float(value.start), float(value.end)
        if not low < high:
            raise ConfigError(f"{line}: interval(a,b) needs a < b")
        if "log" in tags and low <= 0.0:
            raise ConfigError(f"{line}: tag(log, interval(a,b)) needs a > 0")
        return FloatDistribution(low, high, log="log" in tags)
    if "log" in tags:
        raise ConfigError(f"{line}: the log tag applies to interval(a,b) only")
    values = list(override.sweep_iterator(transformer=Transformer.encode))
    if not values:
        raise ConfigError(f"{line}: the sweep has no values")
    if isinstance(value, RangeSweep) and all(type(v) is int for v in values):
        step = int(value.step)
        if step > 0 and not value.shuffle:
            return IntDistribution(values[0], values[-1], step=step)
    if isinstance(value, (ChoiceSweep, RangeSweep)):
        for item in values:
            if not isinstance(item, (str, int, float, bool)):
                raise ConfigError(
                    f"{line}: a choice takes strings, numbers and booleans (got {item!r})"
                )
        if len(set(values)) != len(values):
            raise ConfigError(f"{line}: a value appears twice")
        return CategoricalDistribution(values)
    raise ConfigError(f"{line}: not a search dimension Optuna can take")
