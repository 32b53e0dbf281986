"""The server's streams under runtime=grpc: calls without a reply travel with the next call in
one stream message (in order, each still checked by the party), a stream message that does not
parse is refused in one line, and the streams run inside a thread that already runs an event
loop (a notebook). The party programs run in this process, on 127.0.0.1 with ephemeral ports."""

from __future__ import annotations

import asyncio

import pytest

grpc = pytest.importorskip("grpc")

from test_grpc_transport import NUM_PARTIES, credentials, deployment, proposals  # noqa: E402, F401

from vfl_lightning.errors import PartyRefusal  # noqa: E402
from vfl_lightning.runtime.grpc_channel import (  # noqa: E402
    SERVICE,
    STREAM,
    PartyChannel,
    bundle,
    encode_call,
    unbundle,
)
from vfl_lightning.runtime.grpc_parties import GrpcParties  # noqa: E402
from vfl_lightning.runtime.party_config import read_party_config  # noqa: E402
from vfl_lightning.runtime.party_program import PartyProgram  # noqa: E402
from vfl_lightning.wire.frames import FrameError  # noqa: E402


@pytest.fixture
def programs(deployment):  # noqa: F811
    """Every party's program, serving in this process, each counting the stream messages it
    receives (``program.messages``); stopped at the end."""
    programs = []
    for m in range(NUM_PARTIES):
        program = PartyProgram(read_party_config(deployment / f"party_{m}.yaml"))
        program.messages = 0
        touch = program.touch

        def counting(program=program, touch=touch) -> None:
            program.messages += 1
            touch()

        program.touch = counting
        programs.append(program)
    server = credentials(deployment / "certs", "server")
    channels = [
        PartyChannel(m, f"127.0.0.1:{program.start()}", server, timeout_s=30)
        for m, program in enumerate(programs)
    ]
    yield programs, channels
    for program in programs:
        program.stop(0, "")
        program.wait()


def lr(program) -> float:
    return program.session.own.optimizer.param_groups[0]["lr"]


def test_calls_without_a_reply_travel_with_the_next_call_in_one_message(deployment, programs):  # noqa: F811
    programs, channels = programs
    parties = GrpcParties(channels, proposals(deployment))
    try:
        before = [program.messages for program in programs]
        rates = [lr(program) for program in programs]
        parties.set_lr_factor(0.5)
        parties.set_lr_factor(0.25)
        assert [program.messages for program in programs] == before  # held, nothing sent yet
        digests = parties.party_digests()
        # the two updates and the digest: one stream message per party, run in order (the
        # factor is the initial rate's, so the last one sent holds)
        assert [program.messages - b for program, b in zip(programs, before)] == [1] * NUM_PARTIES
        assert [lr(program) for program in programs] == [rate * 0.25 for rate in rates]
        assert digests == [program.session.own.digest() for program in programs]
        # a held call the party refuses is still refused, at the server's next reply
        parties.set_lr_factor(2.0)
        with pytest.raises(PartyRefusal) as refused:
            parties.party_digests()
        line = str(refused.value)
        assert line.startswith("party 0 refused set_lr_factor: a learning-rate factor is in (0, 1]")
        assert [lr(program) for program in programs] == [rate * 0.25 for rate in rates]
    finally:
        parties.close()


def test_a_stream_message_that_does_not_parse_is_refused_in_one_line(deployment, programs):  # noqa: F811
    programs, channels = programs
    GrpcParties(channels, proposals(deployment)).close()  # a proposal, so a session exists
    call = encode_call("Open", {"session": "0" * 32})
    assert [bytes(c) for c in unbundle(bundle([call, call]))] == [call, call]
    for broken in (b"", bundle([call])[:-1], bundle([call])[:3]):
        with pytest.raises(FrameError):
            unbundle(broken)
    server = credentials(deployment / "certs", "server")
    channel = PartyChannel(0, channels[0].address, server, timeout_s=30)
    stream = channel.channel.stream_stream(f"/{SERVICE}/{STREAM}")
    with pytest.raises(grpc.RpcError) as refused:
        list(stream(iter([bundle([call])[:-1]]), timeout=30))
    channel.close()
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details() == (
        "party 0 refuses a stream message: its frame does not decode (a stream message ends "
        "inside a call); the server must run the party's vfl_lightning version"
    )


def test_the_streams_run_in_a_thread_that_runs_an_event_loop(deployment, programs):  # noqa: F811
    """Constructed and called from a coroutine (as in a notebook), the streams' loop runs on a
    thread of its own rather than inside the running one."""
    programs, channels = programs

    async def inside_a_loop() -> None:
        parties = GrpcParties(channels, proposals(deployment))
        try:
            assert parties.loop.threaded
            rates = [lr(program) for program in programs]
            parties.set_lr_factor(0.5)
            digests = parties.party_digests()
            assert digests == [program.session.own.digest() for program in programs]
            assert [lr(program) for program in programs] == [rate * 0.5 for rate in rates]
        finally:
            parties.close()

    asyncio.run(inside_a_loop())


def openmp_threads():
    """A function giving the calling thread's OpenMP thread count, read from the OpenMP runtime
    torch loaded (before torch applies its own setting to that thread): the one in torch's own
    package folders (``torch/lib``, ``torch.libs``) first, else any loaded OpenMP runtime."""
    import ctypes
    import os

    import torch

    site = os.path.dirname(os.path.dirname(torch.__file__))
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line}
    runtimes = sorted(
        (not path.startswith(os.path.join(site, "torch")), path)
        for path in paths
        if os.path.basename(path).startswith(("libgomp", "libomp", "libiomp"))
    )
    assert runtimes, f"torch's parallel backend is OpenMP, yet no OpenMP runtime is loaded: {paths}"
    return ctypes.CDLL(runtimes[0][1]).omp_get_max_threads


def test_a_party_program_s_calls_run_with_its_own_intra_op_threads(deployment):  # noqa: F811
    """gRPC runs a party's calls on worker threads; OpenMP keeps the thread count per thread
    and a new thread starts from the process default, not from what the program's main thread
    set. Each worker starts with the party's configured ``threads``."""
    import dataclasses
    import threading

    import torch

    if "ATen parallel backend: OpenMP" not in torch.__config__.parallel_info():
        pytest.skip("this torch build runs its intra-op work without OpenMP")
    probe = openmp_threads()
    fresh = []
    thread = threading.Thread(target=lambda: fresh.append(probe()))
    thread.start()
    thread.join()
    threads = fresh[0] + 1  # differs from what a new thread starts with
    config = read_party_config(deployment / "party_0.yaml")
    before = torch.get_num_threads()
    seen = []
    try:
        program = PartyProgram(dataclasses.replace(config, threads=threads))
        hello = program.hello

        def probing(fields: dict) -> dict:
            seen.append(probe())
            return hello(fields)

        program.hello = probing
        server = credentials(deployment / "certs", "server")
        channel = PartyChannel(0, f"127.0.0.1:{program.start()}", server, timeout_s=30)
        try:
            assert channel.call("Hello", {})["party"] == 0
        finally:
            channel.close()
            program.stop(0, "")
            program.wait()
    finally:
        torch.set_num_threads(before)
    assert seen == [threads]


def test_the_stream_loop_waits_for_a_wake_or_its_timeout():
    """``until`` returns True once a wake finds the condition true (checked at each wake, not
    before), and False when the timeout passes first, also with a zero timeout."""
    from vfl_lightning.runtime.grpc_stream import StreamLoop

    loop = StreamLoop()
    try:
        state = {"done": False, "wakes": 0}

        def wake(done: bool) -> None:
            state["wakes"] += 1
            state["done"] = done
            loop.wake()

        loop.loop.call_soon(wake, False)  # a wake that finds it not done yet
        loop.loop.call_later(0.01, wake, True)
        assert loop.until(lambda: state["done"], 30.0)
        assert state["wakes"] == 2
        assert not loop.until(lambda: False, 0.01)
        assert not loop.until(lambda: False, 0.0)
        assert loop.until(lambda: True, 0.0)
        assert loop.waiter is None
    finally:
        loop.close()
