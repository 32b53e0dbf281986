"""A party's own state files under ``runtime=ray``: ``<root>/party_<m>/runs/<run>/round_<r>.pt``,
written atomically by the party for the server checkpoint of training round r of run ``run`` and
read back on resume.

``<root>`` is ``runtime.party_dir``, or where it is null (the default) the directory the party's
own machine names (:func:`default_party_root`): never inside the server's run directory. Only the
party reads its files, from its own directory, with ``torch.load(weights_only=True)``: tensors and
plain containers, never a pickled object, so a planted file cannot run code in the party."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from vfl_lightning.checkpoints import atomic_torch_save

PARTY_DIR_ENV = "VFL_LIGHTNING_PARTY_DIR"
"""The environment variable that names the parties' root on a party's machine."""

RUN_KEY = re.compile(r"[0-9a-f]{32}")
"""A run's key: 32 lowercase hex digits (the folder of its state files)."""


def default_party_root() -> Path:
    """The parties' root when ``runtime.party_dir`` is null, read in the party's own process:
    ``$VFL_LIGHTNING_PARTY_DIR``, else ``$XDG_STATE_HOME/vfl_lightning/parties``, else
    ``~/.local/state/vfl_lightning/parties``."""
    named = os.environ.get(PARTY_DIR_ENV)
    if named:
        return Path(named).expanduser().resolve()
    state = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(state).expanduser().resolve() / "vfl_lightning" / "parties"


def party_folder(party_dir: str | Path, party: int) -> Path:
    """Party ``party``'s own directory under the parties' root: its identity key, its pinned
    peers and its runs' state files."""
    return Path(party_dir) / f"party_{int(party)}"


def check_run_key(run: str) -> str:
    if not isinstance(run, str) or not RUN_KEY.fullmatch(run):
        raise ValueError(f"a run key is 32 lowercase hex digits, got {run!r}")
    return run


def party_state_path(party_dir: str | Path, party: int, run: str, round: int) -> Path:
    run_folder = party_folder(party_dir, party) / "runs" / check_run_key(run)
    return run_folder / f"round_{int(round)}.pt"


KEPT_ROUNDS = 3
"""State files a party keeps: the newest three rounds. It resumes only from the newest or the one
before it (:func:`resumable_rounds`); the oldest stays for its operator (a party's own decision to
go back that far, never the server's)."""


def saved_rounds(party_dir: str | Path, party: int, run: str) -> list[int]:
    """The rounds party ``party`` saved for run ``run``, newest first."""
    folder = party_state_path(party_dir, party, run, 0).parent
    if not folder.is_dir():
        return []
    rounds = [
        int(p.stem.removeprefix("round_"))
        for p in folder.glob("round_*.pt")
        if p.stem.removeprefix("round_").isdigit()
    ]
    return sorted(rounds, reverse=True)


def latest_saved_round(party_dir: str | Path, party: int, run: str) -> int | None:
    """The newest round party ``party`` saved for run ``run`` (None: none)."""
    return next(iter(saved_rounds(party_dir, party, run)), None)


def resumable_rounds(party_dir: str | Path, party: int, run: str) -> list[int]:
    """The rounds party ``party`` resumes run ``run`` from: the newest it saved, and the one it
    saved before it. The server asks every party to save before it writes its own checkpoint
    (and only once its previous checkpoint is on disk), so a run stopped in between (a party or
    the server killed after a party saved) has a last checkpoint one save behind that party's
    newest state; any older round is refused. Going back one save gives a server nothing that
    releases past the newest save and a resume from it do not: the party's private streams
    restart from fresh entropy on every load, PBM's pair seeds come from a new agreement, and
    the program's ledger (``runtime=grpc``) keeps counting every release."""
    return saved_rounds(party_dir, party, run)[:2]


def resume_refusal(run: str, rounds: list[int], round: int) -> str:
    """The rule a party states when a server asks it to resume ``run`` from another ``round``
    than those of :func:`resumable_rounds`."""
    before = f", or the one before it, round {rounds[1]}" if len(rounds) > 1 else ""
    return (
        f"it resumes only from the newest state it saved for run {run}, round {rounds[0]}"
        f"{before}, not round {round}"
    )


def save_party_state(party_dir: str | Path, party: int, run: str, round: int, state: dict) -> Path:
    """Write party ``party``'s ``state`` for training round ``round`` of run ``run`` and remove
    that run's state files older than the newest :data:`KEPT_ROUNDS`; returns the file."""
    path = party_state_path(party_dir, party, run, round)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    atomic_torch_save({"party": int(party), "round": int(round), "state": state}, path)
    rounds = sorted(
        int(p.stem.removeprefix("round_"))
        for p in path.parent.glob("round_*.pt")
        if p.stem.removeprefix("round_").isdigit()
    )
    for old in rounds[:-KEPT_ROUNDS]:
        party_state_path(party_dir, party, run, old).unlink(missing_ok=True)
    return path


def load_party_state(
    party_dir: str | Path, party: int, run: str, round: int
) -> tuple[dict | None, str]:
    """(party ``party``'s state saved for round ``round`` of run ``run``, "") or (None, one line
    saying why it cannot be used: missing, unreadable or not tensors and plain values, or saved
    by another party or for another round)."""
    path = party_state_path(party_dir, party, run, round)
    if not path.is_file():
        saved = (
            sorted(p.name for p in path.parent.glob("round_*.pt")) if path.parent.is_dir() else []
        )
        return None, (
            f"party {party} has no state for training round {round} of the checkpoint: {path} is "
            f"missing (its directory holds {saved or 'nothing'}); resume from a checkpoint whose "
            "round the party saved"
        )
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return None, (
            f"party {party}'s state file {path} cannot be read as tensors and plain values: "
            f"{type(error).__name__}{': ' + reason[:200] if reason else ''}"
        )
    found = (saved.get("party"), saved.get("round")) if isinstance(saved, dict) else (None, None)
    if found != (int(party), int(round)):
        return None, (
            f"{path} holds the state of party {found[0]} at round {found[1]}, not party {party} "
            f"at round {round} (the server checkpoint's): refusing a mismatched resume"
        )
    return saved["state"], ""
