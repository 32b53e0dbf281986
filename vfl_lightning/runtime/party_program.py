"""The party program of ``runtime=grpc`` (``python -m vfl_lightning.party serve --config FILE``):
reads its own configuration, TLS files and data file, serves the party service over mutual TLS,
and runs each session the server opens with an accepted proposal, its calls in order. It exits
with one line when the server goes quiet in a session (its state intact), when no server came
within ``wait_s``, or on SIGTERM / Ctrl-C."""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np
import torch

from vfl_lightning.errors import ConfigError
from vfl_lightning.mechanisms.certificates import Credentials, party_name
from vfl_lightning.runtime.grpc_channel import (
    PartyRefusal,
    PartyService,
    ProposalRefused,
    one_line,
    start_server,
)
from vfl_lightning.runtime.grpc_party import OwnData, PartySession
from vfl_lightning.runtime.grpc_proposal import check_proposal
from vfl_lightning.runtime.party_config import PartyConfig
from vfl_lightning.runtime.party_ledger import PartyLedger

POLL_S = 0.2
STOP_WAIT_S = 5.0
"""How long a stopping program waits for gRPC to send the replies of the messages in hand."""


def read_own_data(path: Path) -> OwnData:
    """The party's data file: ``ids`` (distinct int64 or string sample ids) and ``x`` (float32,
    one row per id), the rows it holds in its own order (``python -m vfl_lightning.data.export``
    writes such files); the PSI aligns them with the label holder's before training."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except (OSError, ValueError) as error:
        reason = " ".join(str(error).split())[:200]
        raise ConfigError(
            f"data={path} cannot be read as a numpy .npz file ({reason}): python -m "
            "vfl_lightning.data.export writes one (ids and x)"
        ) from None
    ids, x = arrays.get("ids"), arrays.get("x")
    if ids is None or x is None:
        raise ConfigError(
            f"data={path} lacks ids or x: a party's data file holds the sample ids of its rows "
            "and their columns"
        )
    if not (ids.dtype == np.int64 or ids.dtype.kind == "U") or ids.ndim != 1:
        raise ConfigError(f"data={path}: ids must be one column of int64 or string sample ids")
    if len(np.unique(ids)) != len(ids):
        raise ConfigError(f"data={path}: ids repeats a sample id; every row needs its own id")
    if x.dtype != np.float32 or len(x) != len(ids):
        raise ConfigError(f"data={path}: x must be float32, one row per sample id")
    return OwnData(ids, torch.from_numpy(x))


def session_class(protocol: dict) -> tuple[type[PartySession], tuple[str, ...]]:
    """The session class of the protocol the party agreed to run (its family's calls), and the
    protocol settings it checks in a proposal (the class's ``PARTY_SETTINGS``)."""
    from hydra.utils import get_class

    try:
        protocol_class = get_class(protocol["_target_"])
    except Exception as error:
        raise ConfigError(
            f"protocol._target_={protocol['_target_']} cannot be imported: {error}"
        ) from None
    settings = tuple(getattr(protocol_class, "PARTY_SETTINGS", ("_target_", "name")))
    if "grpc" not in getattr(protocol_class, "RUNTIMES", ()):
        raise ConfigError(
            f"protocol._target_={protocol['_target_']} does not run on runtime=grpc (its "
            f"RUNTIMES: {getattr(protocol_class, 'RUNTIMES', ())})"
        )
    family = getattr(protocol_class, "PARTY_CALLS", "sync")
    from vfl_lightning.runtime import grpc_sessions

    return grpc_sessions.SESSIONS[family], settings


def check_policy(session: PartySession) -> None:
    """Refuse a proposal whose training releases the party's own policy refuses from the first
    (a protocol without noise under ``allow_clean: false``, noise below ``min_noise``, an ε cap
    one release would pass): one line, before the run starts, rather than at its first batch."""
    guard = session.own.guard
    noise = None if guard.noise.coded else guard.noise.at("train")
    try:
        guard.budget.check("the proposal", "train", None, noise)
    except PartyRefusal as error:
        raise ProposalRefused(str(error)) from None


class PartyProgram:
    """Party ``config.party``'s service: the TLS material and data it read, the current session
    and the order of its calls."""

    def __init__(self, config: PartyConfig) -> None:
        self.config = config
        torch.set_num_threads(config.threads)
        self.credentials = Credentials.from_files(
            config.ca, config.cert, config.key, settings=("tls.ca", "tls.cert", "tls.key")
        )
        own_name = party_name(config.party)
        if self.credentials.name != own_name:
            raise ConfigError(
                f"tls.cert={config.cert} names {self.credentials.name}, but party "
                f"{config.party}'s certificate must name {own_name}"
            )
        self.data = read_own_data(config.data)
        self.ledger = PartyLedger(config, self.data.ids)
        self.session_class, self.settings = session_class(config.protocol)
        self.session: PartySession | None = None
        self.order = threading.Lock()
        self.last_call = time.monotonic()
        self.started = time.monotonic()
        self.exit_code: int | None = None
        self.exit_line = ""
        self.done = threading.Event()
        self.stopping = False
        self.service: PartyService | None = None

    # ----------------------------------------------------------------- calls
    def touch(self) -> None:
        self.last_call = time.monotonic()

    def hello(self, fields: dict) -> dict:
        return {"party": self.config.party, "name": party_name(self.config.party)}

    def propose(self, fields: dict) -> dict:
        proposal = fields["proposal"]
        check_proposal(self.config, proposal, settings=self.settings, shape=self.data.shape)
        session = self.session_class(self.config, self.credentials, self.data, proposal)
        widths = proposal.get("widths") or []
        party = self.config.party
        if party >= len(widths) or widths[party] != session.width:
            raise ProposalRefused(
                f"party {party} refuses the proposal: embedding width "
                f"{widths[party] if party < len(widths) else None!r} in the proposal, "
                f"{session.width} from its model ({self.config.path})"
            )
        check_policy(session)
        self.ledger.attach(session)
        self.session = session
        print(f"party {party} accepted the proposal (run {session.run})", flush=True)
        return {"session": session.session, "party": party, "width": session.width}

    def open_session(self, session_id: str):
        """The runner of the session ``session_id`` (the current one): each call to its method,
        one at a time; ``Close`` ends the session."""
        session = self.session
        if session is None or session_id != session.session:
            raise PartyRefusal(
                f"party {self.config.party} refuses to open session {session_id!r}: the server "
                "must propose the run first"
            )

        def run(method: str, fields: dict) -> dict | None:
            if self.session is not session:
                raise PartyRefusal(
                    f"party {self.config.party} refuses {method}: its session was replaced"
                )
            if method == "Close":
                return self.close(session, fields["status"])
            name = session.METHODS.get(method)
            if name is None:
                raise PartyRefusal(
                    f"party {self.config.party} refuses {method}: it runs "
                    f"{self.config.protocol.get('name')}, whose parties answer no {method}"
                )
            with self.order:
                if self.stopping:
                    raise PartyRefusal(
                        f"party {self.config.party} refuses {method}: it is stopping"
                    )
                return getattr(session, name)(fields)

        return run

    def close(self, session: PartySession, status: str) -> None:
        closed = one_line(status, 80)  # the server's text
        print(f"party {self.config.party}: the server closed the run ({closed})", flush=True)
        with self.order:
            self.ledger.save()
        self.session = None
        if self.config.once:
            self.stop(0, "")

    def handlers(self) -> PartyService:
        return PartyService(
            self.config.party,
            self.config.server_name,
            {"Hello": self.hello, "Propose": self.propose},
            self.open_session,
            self.touch,
        )

    # ----------------------------------------------------------------- serving
    def worker_threads(self) -> None:
        """Run at the start of each of gRPC's worker threads, where the calls run: the party's
        ``threads`` intra-op threads there too. OpenMP keeps the count per thread and a new
        thread starts from the process default (``OMP_NUM_THREADS`` or every core), so
        without this a call's BLAS work could fan out on threads the party did not allow."""
        torch.set_num_threads(self.config.threads)

    def stop(self, code: int, line: str) -> None:
        if self.exit_code is None:
            self.exit_code, self.exit_line = code, line
        self.done.set()

    def watch(self) -> None:
        """Stop with one line when a session's server went quiet for ``idle_timeout_s``, or no
        server proposed within ``wait_s``."""
        config = self.config
        while not self.done.wait(POLL_S):
            now = time.monotonic()
            if self.session is not None and now - self.last_call > config.idle_timeout_s:
                self.stop(
                    1,
                    f"party {config.party}: no call from the server for "
                    f"{config.idle_timeout_s:g} s (idle_timeout_s); the server is gone. Its "
                    f"state in {config.state_dir} is intact: restart this program to resume",
                )
            elif (
                self.session is None
                and config.wait_s is not None
                and now - self.last_call > config.wait_s
            ):
                self.stop(
                    1,
                    f"party {config.party}: no server proposed a run within {config.wait_s:g} s "
                    "(wait_s)",
                )

    def start(self, port_file: Path | None = None) -> int:
        """Serve the party service and watch for a quiet server; returns the bound port."""
        self.service = self.handlers()
        handler = self.service.handler()
        self.server, port = start_server(
            handler, self.config.listen, self.credentials, initializer=self.worker_threads
        )
        host = self.config.listen.rpartition(":")[0]
        if port_file is not None:
            port_file.write_text(f"{port}\n")
        print(
            f"party {self.config.party} listening on {host}:{port} as "
            f"{party_name(self.config.party)}, accepting the server {self.config.server_name}",
            flush=True,
        )
        threading.Thread(target=self.watch, daemon=True).start()
        return port

    def wait(self) -> int:
        """Block until the program stops; its exit code (the stop's line printed first). The
        call running then finishes and no call runs after it; once gRPC has sent the replies of
        the messages in hand (at most ``STOP_WAIT_S``), every stream still open (a quiet server's)
        is cancelled at once rather than after a grace period; then the ledger is written."""
        self.done.wait()
        with self.order:
            self.stopping = True
        if self.service is not None:
            self.service.wait_idle(STOP_WAIT_S)
        self.server.stop(grace=None)
        with self.order:
            self.ledger.save()
        if self.exit_line:
            print(f"error: {self.exit_line}", file=sys.stderr, flush=True)
        return int(self.exit_code or 0)

    def serve(self, port_file: Path | None = None) -> int:
        """:meth:`start`, stop on SIGTERM or Ctrl-C, :meth:`wait`."""
        self.start(port_file)
        for stop_signal in (signal.SIGTERM, signal.SIGINT):
            signal.signal(stop_signal, lambda number, frame: self.stop(0, ""))
        return self.wait()
