"""Where the parties of a run live: a runtime, chosen by ``_target_`` in ``conf/runtime`` like every
other group. ``train(cfg)`` asks it, in order, to check the config, start, make the data module and
the party models the server process holds, attach the parties to the built module, and stop."""

from __future__ import annotations

from hydra.utils import get_class
from omegaconf import DictConfig

from vfl_lightning.algorithms.party_factory import PartyFactory
from vfl_lightning.errors import ConfigError


class LocalRuntime:
    """``runtime=local``: every party, the server and the wire in this process; the parties are
    submodules of the protocol's LightningModule, their randomness derived from the run's seed."""

    PRIVATE_SEEDS = False
    """Whether a party may draw its seeds from entropy the server never sees
    (``runtime.party_seeds=private``): only where each party runs in its own process."""

    SETTINGS: tuple[str, ...] = ("name", "party_seeds")
    """The ``runtime.*`` keys this runtime takes (its ``**settings``): another is refused by
    :func:`check_settings` before anything is built."""

    def __init__(self, name: str = "local", **settings) -> None:
        self.name = str(name)
        self.settings = settings

    @classmethod
    def check(cls, cfg: DictConfig, protocol: type) -> None:
        """Refusals of this runtime for ``protocol`` (a class), before anything is built."""

    def start(self, cfg: DictConfig) -> bool:
        """Prepare what the parties run on; whether this call started something to stop."""
        return False

    def server_side(self, factory: PartyFactory):
        """(data module, party models, the parties' embedding widths) of the server's process:
        here the party models, and their widths."""
        datamodule = factory.datamodule()
        parties = factory.party_models(datamodule.party_shapes)
        return datamodule, parties, [int(p.embedding_dim) for p in parties]

    def attach(self, cfg: DictConfig, module) -> None:
        """Connect the built ``module`` to its parties (local: they are its own submodules, and
        every one takes the config's ``policy``)."""
        module.party_side.use_policy(party_policy(cfg))

    def stop(self) -> None:
        """Release what :meth:`start` started."""


def check_settings(cfg: DictConfig, runtime: type[LocalRuntime]) -> None:
    """A ``runtime.*`` key the runtime does not take (``+runtime.foo=1``), in one line."""
    taken = ("_target_", *runtime.SETTINGS)
    unknown = [str(key) for key in cfg.get("runtime") or {} if key not in taken]
    if unknown:
        name = (cfg.get("runtime") or {}).get("name", "local")
        raise ConfigError(
            f"runtime.{unknown[0]} is not a config key (runtime={name} takes "
            f"{', '.join(sorted(runtime.SETTINGS))}); check the spelling of {unknown[0]!r}, or "
            "drop the override"
        )


def runtime_class(cfg: DictConfig) -> type[LocalRuntime]:
    """The class ``runtime._target_`` names (``runtime=local`` when the group is absent), or one
    ConfigError line."""
    runtime = cfg.get("runtime") or {}
    target = runtime.get("_target_", f"{__name__}.LocalRuntime")
    try:
        found = get_class(target)
    except Exception as error:
        raise ConfigError(
            f"runtime._target_={target} cannot be imported: {error} (a runtime class, e.g. "
            f"{__name__}.LocalRuntime)"
        ) from None
    if not (isinstance(found, type) and issubclass(found, LocalRuntime)):
        raise ConfigError(
            f"runtime._target_={target} is not a runtime (a subclass of {__name__}.LocalRuntime)"
        )
    return found


def make_runtime(cfg: DictConfig) -> LocalRuntime:
    """The run's runtime object, built from ``cfg.runtime`` (its ``_target_`` and settings)."""
    from hydra.utils import instantiate

    cls = runtime_class(cfg)
    runtime = cfg.get("runtime")
    if runtime is None:
        return cls()
    return instantiate(runtime, _convert_="all")


def party_policy(cfg: DictConfig):
    """The parties' privacy policy of the config's ``policy`` group (the defaults without one),
    or one ConfigError naming the bad key."""
    from hydra.utils import instantiate

    from vfl_lightning.algorithms.party_policy import PartyPolicy

    node = cfg.get("policy")
    if node is None:
        return PartyPolicy()
    try:
        policy = instantiate(node, _convert_="all")
    except Exception as error:  # Hydra wraps the class's own ConfigError: raise that one line
        if isinstance(error.__cause__, ConfigError):
            raise error.__cause__ from None
        raise
    if not isinstance(policy, PartyPolicy):
        raise ConfigError(
            f"policy._target_ must name {PartyPolicy.__module__}.PartyPolicy, got "
            f"{node.get('_target_')}"
        )
    return policy
