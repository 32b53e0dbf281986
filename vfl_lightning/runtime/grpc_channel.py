"""The channel of ``runtime=grpc``: a party serves one gRPC service over mutual TLS, the server
calls it. Every request and reply is a frame of a fixed schema (:mod:`~vfl_lightning.wire.frames`,
:mod:`~vfl_lightning.runtime.grpc_schema`; no pickle); grpcio's generic handlers carry the bytes.
A run is one stream per party (:class:`~vfl_lightning.runtime.grpc_stream.PartyStream`): calls go out in order, without waiting for
earlier replies, and the party answers those that have a reply, in order; one stream message
carries one or more calls (calls without a reply may wait for the next call and travel with it). A party accepts calls
only from the certificate of the server its configuration names; the server reaches party m only
if that party's certificate names ``party-<m>``; both are checked against the CA each side was
configured with."""

from __future__ import annotations

import contextlib
import logging
import struct
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from vfl_lightning.errors import ConfigError, PartyLost, PartyRefusal, RunFailure
from vfl_lightning.mechanisms.certificates import Credentials, party_name
from vfl_lightning.runtime.grpc_schema import SESSION, UNARY
from vfl_lightning.wire.frames import FrameError, Json, decode_frame, encode_frame

log = logging.getLogger(__name__)

SERVICE = "vfl_lightning.Party"
STREAM = "Session"
MAX_MESSAGE_BYTES = 1 << 30
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.http2.bdp_probe", 0),
    ("grpc.so_reuseport", 0),
]


class ProposalRefused(ConfigError):
    """A party refused the server's proposal: its configuration or policy does not match."""


class PartyFailure(RunFailure):
    """A party could not carry out a call (its one-line reason, naming the party)."""


STATUS_ERRORS = {
    grpc.StatusCode.PERMISSION_DENIED: PartyRefusal,
    grpc.StatusCode.FAILED_PRECONDITION: ProposalRefused,
    grpc.StatusCode.INVALID_ARGUMENT: PartyRefusal,
    grpc.StatusCode.INTERNAL: PartyFailure,
}
"""How a party's refusal reaches the server: its status code picks the error type."""


def one_line(text: str, limit: int = 400) -> str:
    """``text`` on one line, at most ``limit`` characters, every character that does not print
    (a terminal's escape sequence, a bidirectional override) written as its escape: a line may
    carry what the other side sent, and it must not rewrite a terminal or forge another line."""
    line = " ".join(str(text).split())
    if not line.isprintable():
        line = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in line)
    return line if len(line) <= limit else line[: limit - 3] + "..."


def framed(schema: dict[str, str], fields: dict) -> dict:
    """The fields of ``schema`` in its order, a ``json`` field's value wrapped as JSON text."""
    return {
        name: Json(fields[name]) if kind.rstrip("?") == "json" else fields[name]
        for name, kind in schema.items()
    }


def encode_call(method: str, fields: dict) -> bytes:
    """A session call: the method's name, then the frame of its request fields."""
    name = method.encode()
    return struct.pack("<B", len(name)) + name + encode_frame(framed(SESSION[method][0], fields))


def bundle(calls: list[bytes]) -> bytes:
    """One stream message carrying ``calls`` (each :func:`encode_call`'s bytes), in order: each
    call's length (4 bytes, little-endian), then the call."""
    return b"".join(struct.pack("<I", len(call)) + call for call in calls)


def unbundle(data: bytes) -> list[memoryview]:
    """The calls of a stream message (:func:`bundle`), in order; an empty message or one whose
    lengths do not add up raises :class:`FrameError`."""
    view, calls, at = memoryview(data), [], 0
    while at < len(view):
        if at + 4 > len(view):
            raise FrameError("a stream message ends inside a call's length")
        (size,) = struct.unpack_from("<I", view, at)
        if at + 4 + size > len(view):
            raise FrameError("a stream message ends inside a call")
        calls.append(view[at + 4 : at + 4 + size])
        at += 4 + size
    if not calls:
        raise FrameError("an empty stream message")
    return calls


def call_name(data: bytes) -> str:
    """The method a session call names, as sent (:func:`decode_call` checks it)."""
    if not data:
        return "an empty call"
    return one_line(bytes(data[1 : 1 + data[0]]).decode(errors="replace"), 60)


def decode_call(data: bytes) -> tuple[str, dict]:
    """(method, request fields) of a session call; an unknown method or a frame that does not
    match its schema raises :class:`FrameError`."""
    if not data:
        raise FrameError("an empty call")
    size = data[0]
    method = bytes(data[1 : 1 + size]).decode(errors="replace")
    if method not in SESSION:
        raise FrameError(f"unknown call {method!r}")
    return method, decode_frame(data[1 + size :], SESSION[method][0], f"{method} call")


# ----------------------------------------------------------------------------- the party's end
def refusal_status(error: BaseException) -> grpc.StatusCode:
    if isinstance(error, ProposalRefused):
        return grpc.StatusCode.FAILED_PRECONDITION
    if isinstance(error, PartyRefusal | PermissionError | FrameError):
        return grpc.StatusCode.PERMISSION_DENIED
    return grpc.StatusCode.INTERNAL


def peer_names(context: grpc.ServicerContext) -> list[str]:
    """The DNS names of the certificate the caller presented (TLS verified it)."""
    auth = context.auth_context()
    return [name.decode(errors="replace") for name in auth.get("x509_subject_alternative_name", [])]


class PartyService:
    """What a party program serves: ``unary`` (method -> fields -> reply fields) and ``session``
    (the session id -> a callable that runs one session call and returns its reply fields)."""

    def __init__(
        self,
        party: int,
        server_name: str,
        unary: dict[str, Callable[[dict], dict]],
        open_session: Callable[[str], Callable[[str, dict], dict | None]],
        on_call: Callable[[], None],
    ) -> None:
        self.party, self.server_name = party, server_name
        self.unary, self.open_session, self.on_call = unary, open_session, on_call
        self.handling = 0
        """Stream messages being handled: from their arrival until gRPC sent their last reply
        (a stream's handler resumes after a reply only once gRPC has sent it)."""
        self.changed = threading.Condition()

    @contextlib.contextmanager
    def handling_message(self):
        with self.changed:
            self.handling += 1
        try:
            yield
        finally:
            with self.changed:
                self.handling -= 1
                self.changed.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no stream message is being handled (every reply sent), at most
        ``timeout_s``; whether it is so."""
        with self.changed:
            return self.changed.wait_for(lambda: self.handling == 0, timeout_s)

    def fail(self, context: grpc.ServicerContext, error: BaseException, method: str) -> None:
        """Print the failure's one line and end the call with it."""
        line = one_line(str(error) or type(error).__name__)
        if isinstance(error, FrameError):
            line = (
                f"party {self.party} refuses {method}: its frame does not decode ({line}); the "
                "server must run the party's vfl_lightning version"
            )
        elif isinstance(error, PermissionError) and not line.startswith(f"party {self.party} ref"):
            line = f"party {self.party} refuses {method}: {line}"  # a rule of a mechanism's own
        elif not line.startswith("party "):
            line = f"party {self.party} ({method}): {type(error).__name__}: {line}"
        print(f"error: {line}", flush=True)
        if refusal_status(error) == grpc.StatusCode.INTERNAL:
            log.debug("party %d failed %s", self.party, method, exc_info=True)
        context.abort(refusal_status(error), line)

    def check_caller(self, context: grpc.ServicerContext) -> None:
        self.on_call()
        names = peer_names(context)
        if self.server_name not in names:
            line = (
                f"party {self.party} accepts calls only from the server {self.server_name}, not "
                f"from a certificate naming {names}"
            )
            print(f"error: {line}", flush=True)
            context.abort(grpc.StatusCode.PERMISSION_DENIED, line)

    def unary_handler(self, method: str):
        request_schema, reply_schema = UNARY[method]

        def serve(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.check_caller(context)
            try:
                fields = decode_frame(request, request_schema, f"{method} request")
                return encode_frame(framed(reply_schema, self.unary[method](fields)))
            except Exception as error:
                self.fail(context, error, method)

        return grpc.unary_unary_rpc_method_handler(serve)

    def stream(self, requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
        """One session: its first call opens it, then each call runs in order and the calls that
        have a reply are answered in order. A refusal or failure ends the stream with its line."""
        self.check_caller(context)
        method = "Open"
        try:
            run = None
            for message in requests:
                self.on_call()
                method = "a stream message"  # until its calls are read
                with self.handling_message():
                    for data in unbundle(message):
                        method = call_name(data)  # the call that fails to decode is named
                        method, fields = decode_call(data)
                        if run is None:
                            if method != "Open":
                                raise PartyRefusal(
                                    f"party {self.party} refuses {method}: a session starts "
                                    "with Open"
                                )
                            run = self.open_session(fields["session"])
                            yield encode_frame({})
                            continue
                        reply = run(method, fields)
                        reply_schema = SESSION[method][1]
                        if reply_schema is not None:
                            yield encode_frame(framed(reply_schema, reply))
                        if method == "Close":
                            return
        except Exception as error:
            if context.is_active():
                self.fail(context, error, method)

    def handler(self) -> grpc.GenericRpcHandler:
        handlers = {method: self.unary_handler(method) for method in UNARY}
        handlers[STREAM] = grpc.stream_stream_rpc_method_handler(self.stream)
        return grpc.method_handlers_generic_handler(SERVICE, handlers)


def start_server(
    handler: grpc.GenericRpcHandler,
    address: str,
    credentials: Credentials,
    *,
    workers: int = 8,
    initializer: Callable[[], None] | None = None,
) -> tuple[grpc.Server, int]:
    """A started gRPC server for ``handler`` on ``address`` (``host:port``; port 0: any free
    one), requiring client certificates of the CA; returns (server, bound port). The handlers
    run on a pool of ``workers`` threads, each running ``initializer`` first (per-thread
    settings, such as the intra-op thread count, are not inherited from the thread that
    started the server). A port that cannot be bound is one ConfigError."""
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=workers, initializer=initializer)
    server = grpc.server(pool, options=OPTIONS)
    server.add_generic_rpc_handlers((handler,))
    tls = grpc.ssl_server_credentials(
        [(credentials.key, credentials.certificate)],
        root_certificates=credentials.ca,
        require_client_auth=True,
    )
    try:
        port = server.add_secure_port(address, tls)
    except RuntimeError as error:
        port, reason = 0, one_line(str(error))
    else:
        reason = "grpc bound no port"
    if not port:
        server.stop(None)
        raise ConfigError(
            f"listen={address} cannot be bound ({reason}): the port is in use or the address is "
            "not this machine's; choose another port"
        )
    server.start()
    return server, port


# ----------------------------------------------------------------------------- the server's end
def describe_rpc_error(error: grpc.RpcError) -> str:
    details = error.details() if hasattr(error, "details") else str(error)
    return one_line(details or str(error.code()))


class PartyChannel:
    """The server's channel to party ``party`` at ``address``: TLS with the server's
    ``credentials`` (its certificate, and the CA the party's certificate must chain to), and
    the party's certificate must name ``party-<party>``. A call waits at most ``timeout_s``."""

    def __init__(
        self, party: int, address: str, credentials: Credentials, *, timeout_s: float
    ) -> None:
        self.party, self.address, self.timeout_s = int(party), address, float(timeout_s)
        tls = grpc.ssl_channel_credentials(
            root_certificates=credentials.ca,
            private_key=credentials.key,
            certificate_chain=credentials.certificate,
        )
        options = [*OPTIONS, ("grpc.ssl_target_name_override", party_name(party))]
        self.tls, self.options = tls, options
        self.channel = grpc.secure_channel(address, tls, options=options)
        self.unary = {method: self.channel.unary_unary(f"/{SERVICE}/{method}") for method in UNARY}
        self.sent = 0
        self.received = 0
        self.last_call = time.monotonic()

    def failure(self, what: str, error: grpc.RpcError) -> Exception:
        """The server's error for a failed call: the party's own refusal line, or PartyLost
        naming the party and its address."""
        code = error.code()
        details = describe_rpc_error(error)
        if code in STATUS_ERRORS and details.startswith(f"party {self.party}"):
            return STATUS_ERRORS[code](details)
        return PartyLost(
            f"party {self.party} at {self.address} is lost ({what}: {code.name}: {details})"
        )

    def call(self, method: str, fields: dict, *, timeout_s: float | None = None) -> dict:
        """A unary call (``Hello``, ``Propose``)."""
        request_schema, reply_schema = UNARY[method]
        data = encode_frame(framed(request_schema, fields))
        self.sent += len(data)
        self.last_call = time.monotonic()
        try:
            reply = self.unary[method](data, timeout=timeout_s or self.timeout_s)
        except grpc.RpcError as error:
            raise self.failure(method, error) from None
        self.received += len(reply)
        try:
            return decode_frame(reply, reply_schema, f"party {self.party}'s {method} reply")
        except FrameError as error:
            raise PartyFailure(str(error)) from None

    def wait_ready(self, timeout_s: float) -> None:
        """Return once the TLS connection is up; else one PartyLost line after ``timeout_s``
        naming the party, its address and gRPC's last reason."""
        request = encode_frame({})
        try:
            self.unary["Hello"](request, timeout=timeout_s, wait_for_ready=True)
        except grpc.RpcError as error:
            reason = describe_rpc_error(error)
            lost = PartyLost(
                f"party {self.party} at {self.address} is not reachable over mutual TLS after "
                f"{timeout_s:g} s ({error.code().name}: {reason}); is the party program running "
                f"there, with a certificate naming {party_name(self.party)} from the same CA?"
            )
            lost.reason = f"{error.code().name}: {reason}"
            raise lost from None

    def aio_channel(self) -> grpc.aio.Channel:
        """A ``grpc.aio`` channel to the party with the same TLS (made on the running loop)."""
        return grpc.aio.secure_channel(self.address, self.tls, options=self.options)

    def close(self) -> None:
        self.channel.close()
