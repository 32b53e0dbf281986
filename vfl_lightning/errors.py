"""The library's error types, standard library only: a configuration that cannot run (exit 2) and
a run that failed for a stated reason (exit 1); ``run.outcome`` turns them into exit codes."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value that cannot run: the message names the value and what is allowed."""


class RunFailure(RuntimeError):
    """A run that cannot go on for a stated reason (the message says which and what to do): the
    command line prints its one line and exits 1. Every such failure derives from it."""


class NonFiniteLoss(RunFailure):
    """Training produced a non-finite loss or parameter (the message names the round)."""


class PartyLost(RunFailure):
    """A party process (Ray actor) died: the message names the party and the round."""


class PartyRefusal(RunFailure):
    """A party refused a call of the server: the message names the party, the call and the rule it
    enforces (its protocol's next step, or its own privacy budget)."""


def resume_advice(checkpoint: str | None, restart: str = "") -> str:
    """How a run a lost party stopped goes on, after ``restart`` (what to bring back first, e.g.
    "restart the party program and "): resume from ``checkpoint``, the run's checkpoint on disk
    (the last one it wrote, else the one it resumed from), or, with none, run the same command
    again (training starts where that command starts it)."""
    if checkpoint is not None:
        return (
            f"the run stopped, its last checkpoint is intact: {restart}resume with "
            f"ckpt_path={checkpoint}"
        )
    return (
        f"the run stopped before it wrote a checkpoint: {restart}run the same command again "
        "(there is nothing to resume from)"
    )


class Terminated(BaseException):
    """The process received SIGTERM (or the user's Ctrl-C): the run stops where it is, records
    ``status: interrupted`` in results.json, and the command line prints this message in one line
    and exits with ``exit_code`` (143 for SIGTERM, 130 for Ctrl-C, the shell's codes). A
    BaseException, as KeyboardInterrupt, so no ``except Exception`` on the way swallows it."""

    def __init__(self, message: str = "", exit_code: int = 143) -> None:
        super().__init__(message)
        self.exit_code = exit_code
