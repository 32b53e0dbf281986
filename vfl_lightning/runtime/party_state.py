"""A party's own state files under ``runtime=ray``: ``<party_dir>/party_<m>/round_<r>.pt``, written
atomically by the party for the server checkpoint of training round r and read back on resume."""

from __future__ import annotations

from pathlib import Path

import torch

from vfl_lightning.checkpoints import atomic_torch_save


def party_folder(party_dir: str | Path, party: int) -> Path:
    """Party ``party``'s own directory under ``runtime.party_dir``: its state files, identity key
    and pinned peers."""
    return Path(party_dir) / f"party_{int(party)}"


def party_state_path(party_dir: str | Path, party: int, round: int) -> Path:
    return party_folder(party_dir, party) / f"round_{int(round)}.pt"


KEPT_ROUNDS = 3
"""State files a party keeps: the newest three rounds. The server writes its checkpoint in the
background after the parties saved theirs, so when a run is killed its last complete checkpoint
can be two saves behind the newest party state, never more."""


def save_party_state(party_dir: str | Path, party: int, round: int, state: dict) -> Path:
    """Write party ``party``'s ``state`` for training round ``round`` and remove its state files
    older than the newest :data:`KEPT_ROUNDS`; returns the file."""
    path = party_state_path(party_dir, party, round)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_torch_save({"party": int(party), "round": int(round), "state": state}, path)
    rounds = sorted(
        int(p.stem.removeprefix("round_"))
        for p in path.parent.glob("round_*.pt")
        if p.stem.removeprefix("round_").isdigit()
    )
    for old in rounds[:-KEPT_ROUNDS]:
        party_state_path(party_dir, party, old).unlink(missing_ok=True)
    return path


def load_party_state(party_dir: str | Path, party: int, round: int) -> tuple[dict | None, str]:
    """(party ``party``'s state saved for round ``round``, "") or (None, one line saying why it
    cannot be used: missing, unreadable, or saved by another party or for another round)."""
    path = party_state_path(party_dir, party, round)
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
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as error:
        return None, f"party {party}'s state file {path} cannot be read: {type(error).__name__}"
    found = (saved.get("party"), saved.get("round")) if isinstance(saved, dict) else (None, None)
    if found != (int(party), int(round)):
        return None, (
            f"{path} holds the state of party {found[0]} at round {found[1]}, not party {party} "
            f"at round {round} (the server checkpoint's): refusing a mismatched resume"
        )
    return saved["state"], ""
