"""A party program's policy caps hold over every run and session it serves, not only within one:
a server that proposes again (the same run, or a new run key), aligns the rows anew before a
resume, or waits for the program to be restarted, still gets no row released past the party's
``max_releases_per_row``. The count is by the party's own rows (``<state_dir>/party_<m>/
released.pt``), and a refusal names the aligned position the server asked for, never the
party's own row."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("grpc")

from grpc_parties import align, session_of  # noqa: E402

from vfl_lightning.errors import ConfigError, PartyRefusal  # noqa: E402
from vfl_lightning.runtime.party_config import read_party_config  # noqa: E402
from vfl_lightning.runtime.party_program import PartyProgram  # noqa: E402

LDP = ["algo=ldp", "data=breast_cancer", "data.num_parties=2"]
ONCE = {"max_releases_per_row": 1}
RUN = "0" * 32


def send(session, round: int, idx) -> dict:
    return session.send({"idx": torch.as_tensor(idx), "stage": "train", "round": round})


def refused(session, round: int, idx) -> str:
    with pytest.raises(PartyRefusal) as error:
        send(session, round, idx)
    line = str(error.value)
    assert "\n" not in line and line.startswith("party 0 refused send: its budget "), line
    assert "max_releases_per_row=1" in line and "over every run and session it served" in line
    return line


def positions(session, own_rows: np.ndarray) -> list[int]:
    """The aligned train positions of ``own_rows`` (rows of the party's file) in ``session``."""
    aligned = session.alignment.rows["train"]
    return [int(np.flatnonzero(aligned == row)[0]) for row in own_rows]


def test_a_new_proposal_of_the_same_or_another_run_keeps_the_count(tmp_path):
    program, session = session_of(tmp_path, LDP, policy=ONCE)
    send(session, 0, torch.arange(4))
    released = session.alignment.rows["train"][:4]
    # the same run proposed again, no state loaded: a fresh run count, the same program's ledger
    program.propose({"proposal": program.proposal})
    again = program.session
    align(program)
    line = refused(again, 0, torch.arange(4))
    assert line.endswith("this would be release 2 of row 0 of train")
    send(again, 0, torch.arange(4, 8))  # rows it never released
    # a new run key
    program.propose({"proposal": program.proposal | {"run": "1" * 32}})
    other = program.session
    align(program)
    refused(other, 0, positions(other, released)[1:2])
    send(other, 0, torch.arange(8, 12))


def test_a_resume_that_aligns_the_rows_anew_keeps_the_count(tmp_path):
    """The server saves the party at round 1, proposes the run again and runs the PSI with its
    train ids reversed: the state's run count names positions, which now stand for other rows;
    the rows released before the save sit at new positions, and a second release of them is
    refused."""
    program, session = session_of(tmp_path, LDP, policy=ONCE)
    send(session, 0, torch.arange(4))
    released = session.alignment.rows["train"][:4]
    session.save_state({"round": 1})
    program.propose({"proposal": program.proposal})
    resumed = program.session
    program.split_ids["train"] = program.split_ids["train"][::-1].copy()
    align(program)
    assert resumed.load_state({"run": RUN, "round": 1}) == {"problem": ""}
    moved = positions(resumed, released)
    assert moved != [0, 1, 2, 3]
    line = refused(resumed, 1, moved)
    assert line.endswith(f"this would be release 2 of row {moved[0]} of train")
    fresh = [p for p in range(len(resumed.alignment.rows["train"])) if p >= 4 and p not in moved]
    send(resumed, 1, fresh[:4])  # rows it never released


def test_the_count_survives_a_restart_of_the_party_program(tmp_path):
    program, session = session_of(tmp_path, LDP, policy=ONCE)
    send(session, 0, torch.arange(4))
    released = session.alignment.rows["train"][:4]
    session.save_state({"round": 1})  # writes the program's count beside the state
    assert (tmp_path / "state" / "party_0" / "released.pt").is_file()
    restarted = PartyProgram(read_party_config(tmp_path / "party.yaml"))
    restarted.propose({"proposal": program.proposal | {"run": "2" * 32}})
    restarted.split_ids = program.split_ids
    align(restarted)
    fresh = restarted.session
    refused(fresh, 0, positions(fresh, released)[2:3])
    send(fresh, 0, torch.arange(4, 8))
    restarted.close(fresh, "ended")  # the end of a session writes it too
    again = PartyProgram(read_party_config(tmp_path / "party.yaml"))
    again.propose({"proposal": program.proposal})
    again.split_ids = program.split_ids
    align(again)
    refused(again.session, 0, positions(again.session, fresh.alignment.rows["train"][4:5]))


def test_a_count_of_another_data_file_is_refused_in_one_line(tmp_path):
    program, session = session_of(tmp_path, LDP, policy=ONCE)
    send(session, 0, torch.arange(4))
    session.save_state({"round": 1})
    config = read_party_config(tmp_path / "party.yaml")
    data = np.load(config.data)
    other = tmp_path / "other.npz"
    np.savez(other, ids=data["ids"][::-1].copy(), x=data["x"][::-1].copy())
    text = (tmp_path / "party.yaml").read_text().replace(str(config.data), str(other))
    (tmp_path / "party.yaml").write_text(text)
    with pytest.raises(ConfigError) as error:
        PartyProgram(read_party_config(tmp_path / "party.yaml"))
    line = str(error.value)
    assert "\n" not in line and "released.pt counts the releases of party 0's data file" in line
