"""How a run ended: the one-line summary of an error, the exit code it maps to (2: bad
configuration, 1: a stated run failure, none: a bug), interruption, and closing W&B."""

from __future__ import annotations

import inspect
import re
import sys

from hydra.errors import HydraException, InstantiationException
from omegaconf.errors import OmegaConfBaseException

from vfl_lightning.errors import ConfigError, RunFailure

CONFIG_ERRORS = (
    ValueError,
    TypeError,
    OverflowError,
    OSError,
    HydraException,
    OmegaConfBaseException,
)
"""Raised by validators, by a config that combines options a class does not take, by Hydra and
OmegaConf, and by unreadable or unwritable paths: exit 2 (so are Lightning's Trainer arguments,
:func:`config_errors`)."""


def config_errors() -> tuple[type[BaseException], ...]:
    """:data:`CONFIG_ERRORS` and Lightning's ``MisconfigurationException`` (imported here: this
    module is read by the command line before Lightning is)."""
    from lightning.fabric.utilities.exceptions import MisconfigurationException

    return (*CONFIG_ERRORS, MisconfigurationException)


def root_cause(error: BaseException) -> BaseException:
    """The error Hydra's instantiate wrapped (``InstantiationException`` chains the original)."""
    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        error = error.__cause__
    return error


def data_dir_error(error: BaseException, data_dir: str) -> ConfigError | None:
    """``error`` as a ConfigError naming ``paths.data_dir`` when its cause is a filesystem error
    under that directory (it cannot be made, read or written), else None."""
    cause = root_cause(error)
    if isinstance(cause, OSError) and str(cause.filename or "").startswith(data_dir or "\0"):
        return ConfigError(
            f"paths.data_dir={data_dir} cannot be used: {cause.strerror or cause} "
            f"({cause.filename})"
        )
    return None


def error_summary(error: BaseException) -> str:
    """One line: the (unwrapped) error's message with its whitespace collapsed; in a message of
    Lightning's, a Trainer argument it names as `name` becomes this config's key trainer.name."""
    cause = root_cause(error)
    text = " ".join(str(cause).split())
    if _from_lightning(cause):
        text = re.sub(r"`(\w+)(=[^`]*)?`", _trainer_key, text)
    return text or type(cause).__name__


def _from_lightning(error: BaseException) -> bool:
    """Whether Lightning defined ``error``'s class or raised it (its innermost frame)."""
    frame = error.__traceback__
    while frame is not None and frame.tb_next is not None:
        frame = frame.tb_next
    raiser = "" if frame is None else str(frame.tb_frame.f_globals.get("__name__", ""))
    return any(name.startswith("lightning.") for name in (type(error).__module__, raiser))


def _trainer_key(match: re.Match) -> str:
    from lightning import Trainer

    name, value = match.group(1), match.group(2) or ""
    if name not in inspect.signature(Trainer.__init__).parameters:
        return match.group(0)
    return f"trainer.{name}{'=null' if value == '=None' else value}"


def exit_code(error: BaseException) -> int | None:
    """2 for a configuration error, 1 for a :class:`RunFailure`, None for anything else (a bug:
    show its traceback)."""
    cause = root_cause(error)
    if isinstance(cause, RunFailure):
        return 1
    if isinstance(cause, config_errors()):
        return 2
    return None


def interrupted(error: BaseException) -> bool:
    """Whether ``error`` is the user's Ctrl-C (Lightning turns it into ``sys.exit(1)`` raised
    while handling the KeyboardInterrupt)."""
    return isinstance(error, KeyboardInterrupt) or (
        isinstance(error, SystemExit) and isinstance(error.__context__, KeyboardInterrupt)
    )


def finish_wandb(exit_code: int) -> None:
    """Close any W&B run (with the run's exit code) so one failed multirun job does not poison
    the next."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish(exit_code=exit_code)


RUN_LOG_ONLY = {"run_log_only": True}
"""``extra=`` of a log record meant for the run's log file alone: the CLI prints that error once,
as its ``error: ...`` line, and keeps the record off the console."""
