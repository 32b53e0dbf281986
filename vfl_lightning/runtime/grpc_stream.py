"""The server's end of a session's stream under ``runtime=grpc`` (:class:`PartyStream`): every
party's stream is a ``grpc.aio`` call on one asyncio event loop (:class:`StreamLoop`), which the
server's thread runs while it waits for a reply: the loop writes the messages flushed so far and
reads the replies as they arrive. No other Python thread of the server runs per party and
message (gRPC's own I/O threads hold no interpreter lock), so the server's training step never
waits for one to hand the interpreter back."""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

import grpc

from vfl_lightning.errors import PartyLost
from vfl_lightning.runtime.grpc_channel import (
    SERVICE,
    STREAM,
    PartyFailure,
    bundle,
    encode_call,
)
from vfl_lightning.runtime.grpc_schema import SESSION
from vfl_lightning.wire.frames import FrameError, decode_frame

if TYPE_CHECKING:
    from vfl_lightning.runtime.grpc_channel import PartyChannel

END = object()


class StreamLoop:
    """The asyncio event loop of the streams' ``grpc.aio`` calls. It runs on the calling thread
    while that thread waits for a reply (no other Python thread then competes with it for the
    interpreter); where that thread already runs an event loop (a notebook), on a thread of its
    own (``threaded``). Only the thread that made it calls it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.threaded = asyncio._get_running_loop() is not None
        if self.threaded:
            self.thread = threading.Thread(
                target=self.loop.run_forever, name="party-streams", daemon=True
            )
            self.thread.start()
        self.run(self.started())

    async def started(self) -> None:
        self.waiter: asyncio.Future | None = None

    def run(self, coroutine, timeout_s: float | None = None):
        """Run ``coroutine`` on the loop; its result."""
        if self.threaded:
            return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)
        return self.loop.run_until_complete(coroutine)

    def submit(self, function, *args) -> None:
        """``function(*args)`` on the loop: at its next turn where it runs on a thread of its own,
        else now (the loop is not running; what it wakes runs when it next runs)."""
        if self.threaded:
            self.loop.call_soon_threadsafe(function, *args)
        else:
            function(*args)

    def poll(self) -> None:
        """Let the loop handle what has arrived (it runs by itself where ``threaded``)."""
        if not self.threaded:
            self.run(asyncio.sleep(0))

    def until(self, done, timeout_s: float) -> bool:
        """Run the loop until ``done()`` is true (True) or ``timeout_s`` passed (False)."""
        return self.run(self.wait(done, timeout_s))

    async def wait(self, done, timeout_s: float) -> bool:
        """Wait until ``done()`` (True) or ``timeout_s`` passed (False); it is checked again each
        time :meth:`wake` is called (a reply arrived, a stream ended) and at the timeout."""
        if done():
            return True
        expired: list[bool] = []

        def expire() -> None:
            expired.append(True)
            self.wake()

        timer = self.loop.call_later(max(0.0, timeout_s), expire)
        try:
            while not done():
                if expired:
                    return False
                self.waiter = self.loop.create_future()
                await self.waiter
        finally:
            timer.cancel()
            self.waiter = None
        return True

    def wake(self) -> None:
        """Let :meth:`wait` check its condition again (on the loop)."""
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def close(self) -> None:
        if self.loop.is_closed():
            return
        if self.threaded:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5.0)
            if self.thread.is_alive():
                return
        self.loop.close()


class Arrivals:
    """The parties whose replies arrived, in arrival order (``get``, ``get_nowait``, ``empty``
    as a ``queue.Queue``'s), the loop running while the caller waits."""

    def __init__(self, loop: StreamLoop) -> None:
        self.loop, self.parties = loop, deque()

    def put(self, party: int) -> None:
        self.parties.append(party)

    def empty(self) -> bool:
        self.loop.poll()
        return not self.parties

    def get_nowait(self) -> int:
        if self.empty():
            raise queue.Empty
        return self.parties.popleft()

    def get(self, timeout: float) -> int:
        if not self.loop.until(lambda: self.parties, timeout):
            raise queue.Empty
        return self.parties.popleft()


class PartyStream:
    """One session's stream to a party: :meth:`send` queues a call (its reply, if it has one,
    is the next unanswered; ``hold``: a call without a reply waits and goes out in one stream
    message with the next call sent, or at :meth:`flush`); :meth:`reply` waits for the oldest
    unanswered reply. A stream that breaks (the party died, refused a call or failed) raises at
    the next :meth:`reply`; a reply that does not come within the channel's timeout is a lost
    party. ``arrivals`` (shared by several streams): the party's index is put there when a reply
    of it arrives."""

    def __init__(
        self,
        channel: PartyChannel,
        session: str,
        arrivals: Arrivals | None,
        loop: StreamLoop,
    ) -> None:
        self.channel, self.party, self.loop = channel, channel.party, loop
        self.replies: deque = deque()
        self.expected: deque[str] = deque()
        self.arrivals = arrivals
        self.broken: Exception | None = None
        self.skipping = 0
        self.held: list[bytes] = []
        loop.run(self.start())
        self.send("Open", {"session": session})

    # ----------------------------------------------------------------- on the loop
    async def start(self) -> None:
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.aio = self.channel.aio_channel()
        self.call = self.aio.stream_stream(f"/{SERVICE}/{STREAM}")()
        self.writer = asyncio.ensure_future(self.write())
        self.reader = asyncio.ensure_future(self.read())

    async def write(self) -> None:
        """Write each flushed message in order (a broken call shows in :meth:`read`)."""
        with contextlib.suppress(Exception):
            while True:
                data = await self.outbox.get()
                if data is END:
                    await self.call.done_writing()
                    return
                await self.call.write(data)

    async def read(self) -> None:
        try:
            while True:
                data = await self.call.read()
                if data is grpc.aio.EOF:
                    break
                self.arrived(data)
        except asyncio.CancelledError:
            self.arrived(PartyLost(f"party {self.party} at {self.channel.address}: stream closed"))
            return
        except grpc.RpcError as error:
            what = self.expected[0] if self.expected else "stream"
            self.arrived(self.channel.failure(what, error))
            return
        self.arrived(PartyLost(f"party {self.party} at {self.channel.address} ended the session"))

    def arrived(self, data) -> None:
        self.replies.append(data)
        if self.arrivals is not None:
            self.arrivals.put(self.party)
        self.loop.wake()

    async def closed(self, timeout_s: float) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.shield(self.reader), timeout_s)
        self.call.cancel()
        self.writer.cancel()
        with contextlib.suppress(Exception):
            await self.aio.close()

    # ----------------------------------------------------------------- the caller's side
    def send(self, method: str, fields: dict, *, hold: bool = False) -> None:
        self.send_encoded(method, encode_call(method, fields), hold=hold)

    def send_encoded(self, method: str, data: bytes, *, hold: bool = False) -> None:
        """:meth:`send` of a call already encoded (:func:`encode_call`; one encoding may go to
        several parties)."""
        self.channel.sent += 4 + len(data)
        self.channel.last_call = time.monotonic()
        self.held.append(data)
        if SESSION[method][1] is not None:
            self.expected.append(method)
        elif hold:
            return
        self.flush()

    def flush(self) -> None:
        """Send the calls held so far, in one stream message."""
        if self.held:
            self.loop.submit(self.outbox.put_nowait, bundle(self.held))
            self.held = []

    def skip(self) -> None:
        """The oldest unanswered reply is not needed: :meth:`reply` discards it when it comes."""
        self.skipping += 1

    def answered(self) -> bool:
        """Whether the reply :meth:`reply` waits for (or the stream's end) has arrived."""
        return len(self.replies) > self.skipping or self.broken is not None

    def reply(self, timeout_s: float | None = None) -> dict:
        """The oldest unanswered reply, waiting at most ``timeout_s`` (default: the channel's
        timeout)."""
        self.flush()
        while self.skipping:
            self.skipping -= 1
            self.reply(timeout_s)
        if self.broken is not None:
            raise self.broken
        method = self.expected[0] if self.expected else "reply"
        timeout_s = self.channel.timeout_s if timeout_s is None else timeout_s
        if not self.replies and not self.loop.until(lambda: self.replies, timeout_s):
            self.broken = PartyLost(
                f"party {self.party} at {self.channel.address} is lost ({method}: no reply "
                f"within runtime.call_timeout_s={self.channel.timeout_s:g} s)"
            )
            raise self.broken
        data = self.replies.popleft()
        if isinstance(data, Exception):
            self.broken = data
            raise data
        self.expected.popleft()
        self.channel.received += len(data)
        try:
            return decode_frame(data, SESSION[method][1], f"party {self.party}'s {method} reply")
        except FrameError as error:
            raise PartyFailure(str(error)) from None

    def ready(self) -> bool:
        """Whether a reply (or the stream's end) is waiting."""
        self.loop.poll()
        return bool(self.replies)

    def close(self, timeout_s: float = 5.0) -> None:
        """End the stream (after the calls already sent), cancelling it after ``timeout_s``."""
        self.flush()
        if self.loop.loop.is_closed():
            return
        self.loop.submit(self.outbox.put_nowait, END)
        with contextlib.suppress(Exception):
            self.loop.run(self.closed(timeout_s), timeout_s + 5.0)

    def drop(self) -> None:
        """Cut the stream without ending it (what a server that vanishes leaves)."""
        with contextlib.suppress(Exception):
            self.loop.run(self.closed(0.0), 5.0)
