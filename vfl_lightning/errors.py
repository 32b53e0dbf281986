"""The library's error classes and their one-line summaries: what the CLI prints (``error: ...``)
instead of a traceback, and the exit code it uses (2: bad configuration, 1: the run failed)."""

from __future__ import annotations

from hydra.errors import HydraException, InstantiationException
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf.errors import OmegaConfBaseException

RUN_LOG_ONLY = {"run_log_only": True}
"""``extra=`` of a log record meant for the run's log file alone: the CLI prints that error once,
as its ``error: ...`` line, and keeps the record off the console."""


class ConfigError(ValueError):
    """A configuration value that cannot run: the message names the value and what is allowed."""


class NonFiniteLoss(RuntimeError):
    """Training produced a non-finite loss or parameter (the message names the round)."""


class PartyLost(RuntimeError):
    """A party process (Ray actor) died: the message names the party and the round."""


CONFIG_ERRORS = (
    ValueError,
    TypeError,
    OverflowError,
    OSError,
    HydraException,
    OmegaConfBaseException,
    MisconfigurationException,
)
"""Raised by validators, by a config that combines options a class does not take, by Hydra,
OmegaConf and Lightning's Trainer arguments, and by unreadable or unwritable paths: exit 2."""


def run_errors() -> tuple[type[BaseException], ...]:
    """Errors of a run that cannot go on for a stated reason: exit code 1."""
    from vfl_lightning.algorithms.fedvs import StragglerShortfall
    from vfl_lightning.data.download import ChecksumError, DatasetUnavailableError
    from vfl_lightning.mechanisms.lcc import DecodingError

    return (
        NonFiniteLoss,
        PartyLost,
        StragglerShortfall,
        DecodingError,
        DatasetUnavailableError,
        ChecksumError,
    )


def root_cause(error: BaseException) -> BaseException:
    """The error Hydra's instantiate wrapped (``InstantiationException`` chains the original)."""
    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return error


def error_summary(error: BaseException) -> str:
    """One line: the (unwrapped) error's message with its whitespace collapsed."""
    cause = root_cause(error)
    text = " ".join(str(cause).split())
    return text or type(cause).__name__


def exit_code(error: BaseException) -> int | None:
    """2 for a configuration error, 1 for a stated run failure, None for anything else (a bug:
    show its traceback)."""
    cause = root_cause(error)
    if isinstance(cause, run_errors()):
        return 1
    if isinstance(cause, CONFIG_ERRORS):
        return 2
    return None
