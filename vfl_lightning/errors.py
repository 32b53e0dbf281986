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


class Terminated(BaseException):
    """The process received SIGTERM: the run stops where it is, records ``status: interrupted``
    in results.json, and the command line prints this message in one line (exit code 143). A
    BaseException, as KeyboardInterrupt, so no ``except Exception`` on the way swallows it."""
