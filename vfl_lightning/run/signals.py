"""SIGTERM during a run: it stops the run the way Ctrl-C does, so results.json is written with
``status: interrupted`` and the command line prints one line. Inside Lightning's loops,
Lightning's own handler notes the signal and stops at the next batch (``SIGTERMException``);
anywhere else (building, starting Ray, between fit and test) :class:`Terminated` is raised
at once."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vfl_lightning.errors import Terminated

EXIT_CODE = 128 + signal.SIGTERM
"""The exit code of a run stopped by SIGTERM (the shell's code for a process SIGTERM ended)."""

_received = threading.Event()


def _on_sigterm(signum, frame) -> None:
    if _received.is_set():
        return  # already stopping: the results are being written
    _received.set()
    if signal.getsignal(signal.SIGTERM) is _on_sigterm:
        raise Terminated()
    # called by Lightning's handler, which raises SIGTERMException at the next batch


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def sigterm_stops_the_run() -> Iterator[None]:
    """Within: SIGTERM stops the run (see the module docstring); the previous handler is put
    back after."""
    if not _in_main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)
    _received.clear()
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def take_sigterm_back() -> None:
    """Install the handler again where a library replaced it (``ray.init`` sets its own, which
    exits the process without a word)."""
    if _in_main_thread() and signal.getsignal(signal.SIGTERM) is not _on_sigterm:
        signal.signal(signal.SIGTERM, _on_sigterm)


def raise_if_terminated() -> None:
    """:class:`Terminated` if SIGTERM came while a Lightning loop ended on its own (the signal
    arrived after its last check)."""
    if _received.is_set():
        raise Terminated()


def ignore_sigterm_from_here() -> None:
    """A SIGTERM from now on is ignored: the run is writing its results and stopping anyway."""
    _received.set()


def terminated(error: BaseException | None) -> bool:
    """Whether ``error`` is how SIGTERM stopped the run: :class:`Terminated` (also as the cause
    of what a library made of it: Ray's ``get`` wraps it in a SystemError), Lightning's
    ``SIGTERMException`` from inside its loops, or ``SystemExit(15)`` from the handler
    ``ray.init`` installs while it starts Ray."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, Terminated | SIGTERMException):
            return True
        if isinstance(error, SystemExit) and error.code == signal.SIGTERM:
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


INTERRUPT_EXIT_CODE = 128 + signal.SIGINT
"""The exit code of a run stopped by Ctrl-C (SIGINT)."""


def sigterm_message(results: dict, checkpoint: Path | None, by: str = "SIGTERM") -> str:
    """The one line of a run SIGTERM (``by``: or Ctrl-C) stopped: where, and how to go on."""
    where = f"epoch {results.get('epochs', 0)}, training round {results.get('global_step', 0)}"
    resume = (
        f"; resume with ckpt_path={checkpoint}"
        if checkpoint is not None and checkpoint.is_file()
        else " (no checkpoint was written yet)"
    )
    return f"stopped by {by} at {where}: results.json has status interrupted{resume}"
