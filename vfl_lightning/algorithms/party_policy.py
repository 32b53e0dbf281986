"""A party's own privacy policy: the budget and limits it enforces on what it releases and on the
gradients it applies, whatever the server asks. Locally the ``policy`` config group sets it for
every party; a party in its own process reads its own ``policy.yaml`` (:meth:`PartyPolicy.read`),
which the server's command can only tighten (:meth:`PartyPolicy.tightened`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from vfl_lightning.errors import ConfigError

LARGE_GRADIENT = ("refuse", "clip")
"""What a party does with a received gradient whose row norm exceeds its bound."""
POLICY_FILE = "policy.yaml"
"""A party's policy file in its own directory (``runtime=ray``: ``<party_dir>/party_<m>/``)."""


def _positive(value, *, integer: bool = False) -> bool:
    if value is None:
        return True
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if integer and int(value) != value:
        return False
    return math.isfinite(value) and value > 0


@dataclass(frozen=True)
class PartyPolicy:
    """What party m allows itself, checked by the party before every release and every update.

    - ``max_feature_eps``: the largest feature ε at ``delta`` any of its rows may reach (null: no
      cap). ε is counted by the party from the releases it made (:class:`PartyBudget`) with the
      accountant's analysis of its mechanism; a release without noise has ε = ∞, so a cap
      refuses every clean release, and a noisy mechanism the library has no analysis for.
    - ``allow_clean``: whether it releases anything without noise (a plain embedding, a coded sum,
      an evaluation without the mechanism).
    - ``max_releases_per_row``: how often one row of any split may be released (null: no cap).
    - ``min_noise``: the smallest noise of one release it accepts, as the noise's per-element
      standard deviation over the clipping bound (the mechanism's ``noise_multiplier``: LDP
      σ/C, PBM's smallest √(1/4 − β²)/(β√b), Wait-DP σ/clip); null: any.
    - ``max_gradient_norm``: the largest L2 norm of one row of a received gradient (null: any
      finite one); ``large_gradient``: ``refuse`` (the run stops) or ``clip`` (the row is scaled
      down to the bound).

    ``source`` names where it came from in messages (``policy``: the config group; a file path).
    """

    max_feature_eps: float | None = None
    delta: float = 1e-5
    allow_clean: bool = True
    max_releases_per_row: int | None = None
    min_noise: float | None = None
    max_gradient_norm: float | None = None
    large_gradient: str = "refuse"
    source: str = field(default="policy", compare=False)

    def __post_init__(self) -> None:
        checks = (
            ("max_feature_eps", _positive(self.max_feature_eps), "a number > 0 or null"),
            (
                "delta",
                isinstance(self.delta, int | float)
                and not isinstance(self.delta, bool)
                and 0 < self.delta < 1,
                "a number in (0, 1)",
            ),
            ("allow_clean", isinstance(self.allow_clean, bool), "true or false"),
            (
                "max_releases_per_row",
                _positive(self.max_releases_per_row, integer=True),
                "an integer >= 1 or null",
            ),
            ("min_noise", _positive(self.min_noise), "a number > 0 or null"),
            ("max_gradient_norm", _positive(self.max_gradient_norm), "a number > 0 or null"),
            ("large_gradient", self.large_gradient in LARGE_GRADIENT, f"one of {LARGE_GRADIENT}"),
        )
        for key, good, allowed in checks:
            if not good:
                raise ConfigError(
                    f"{self.key(key)} must be {allowed}, got {getattr(self, key)!r} (the party's "
                    "privacy policy, docs/threat_model.md)"
                )

    def key(self, name: str) -> str:
        """How a message names setting ``name``: ``policy.<name>``, or ``<file>: <name>``."""
        return f"policy.{name}" if self.source == "policy" else f"{self.source}: {name}"

    def setting(self, name: str) -> str:
        """``<key>=<value>`` of setting ``name`` for a message."""
        return f"{self.key(name)}={getattr(self, name)}"

    @property
    def needs_noise(self) -> bool:
        """Whether this policy refuses every release without noise."""
        return (
            not self.allow_clean or self.min_noise is not None or self.max_feature_eps is not None
        )

    def tightened(self, other: PartyPolicy | None) -> PartyPolicy:
        """The stricter of this policy and ``other`` in every setting (the smaller ε at the
        smaller δ, clean releases only if both allow them, the smaller caps, the larger minimum
        noise, ``refuse`` over ``clip``): what the server's proposed policy can do to a party's
        own, which it cannot loosen. Messages keep this policy's ``source``."""
        if other is None:
            return self

        def smaller(a, b):
            return b if a is None else a if b is None else min(a, b)

        def larger(a, b):
            return b if a is None else a if b is None else max(a, b)

        refuse = "refuse" in (self.large_gradient, other.large_gradient)
        return replace(
            self,
            max_feature_eps=smaller(self.max_feature_eps, other.max_feature_eps),
            delta=min(self.delta, other.delta),
            allow_clean=self.allow_clean and other.allow_clean,
            max_releases_per_row=smaller(self.max_releases_per_row, other.max_releases_per_row),
            min_noise=larger(self.min_noise, other.min_noise),
            max_gradient_norm=smaller(self.max_gradient_norm, other.max_gradient_norm),
            large_gradient="refuse" if refuse else "clip",
        )

    def as_dict(self) -> dict:
        """The settings (no ``source``): what results and messages report."""
        settings = asdict(self)
        settings.pop("source")
        return settings

    @classmethod
    def read(cls, path: str | Path) -> PartyPolicy:
        """The policy in the YAML file ``path`` (any subset of the settings; the rest default),
        or one ConfigError naming the file and what is wrong with it."""
        import yaml

        path = Path(path)
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as error:
            reason = " ".join(str(error).split())
            raise ConfigError(f"{path} cannot be read as a policy: {reason}") from error
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path} must hold a mapping of policy settings, got {loaded!r}")
        known = {f.name for f in fields(cls)} - {"source"}
        unknown = sorted(str(key) for key in set(loaded) - known)
        if unknown:
            raise ConfigError(
                f"{path} has unknown policy setting(s) {unknown}; allowed: {sorted(known)}"
            )
        return cls(**loaded, source=str(path))

    @classmethod
    def of_party(cls, folder: str | Path, proposed: PartyPolicy | None = None) -> PartyPolicy:
        """Party's policy in its own directory ``folder`` (its :data:`POLICY_FILE`, or the
        defaults where it has none), tightened by the server's ``proposed`` policy."""
        path = Path(folder) / POLICY_FILE
        if not path.is_file():
            return cls() if proposed is None else proposed
        return cls.read(path).tightened(proposed)
