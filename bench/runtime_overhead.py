"""Rounds per second of runtime=ray against runtime=local (digits, M parties), and the share of a
Ray round spent waiting on the party actors (their compute plus the transport) versus a bare echo.

For each algo and runtime, trains with Lightning and times every protocol step (synchronous
family: one round, embeddings up, gradients down, every side steps; ``cascade``: one batch, M
server iterations, each a client's query taken as it arrives, losses back; FedVS:
``fedvs_round`` / ``baseline_round``), and for Ray also the time inside the party calls; a round
is a server update (``global_step``). A third column times a bare echo: the same messages sent to
M no-op actors and back, i.e. the transport alone (for the synchronous family one request per
party and round, as ``RayParties`` sends it, by ``--exchange``: Ray tasks or a compiled graph).
Medians after a warm-up, printed as a table.

FedVS runs ``experiment=fedvs_digits`` (its own N = 8 clients, whatever ``--parties`` says) with
its §6.2 stragglers; under Ray each client really sleeps its delays x ``--time-scale``, so the Ray
rate includes the wait for the R-th coded embedding (about 0.2-0.4 simulated s a round).

    python bench/runtime_overhead.py                      # npq, pbm; 4 parties; 200 rounds
    python bench/runtime_overhead.py --algos npq --parties 4 --rounds 400
    python bench/runtime_overhead.py --algos cascade
    python bench/runtime_overhead.py --algos fedvs --time-scale 0.01
    python bench/runtime_overhead.py --exchange compiled              # Ray Compiled Graphs
    python bench/runtime_overhead.py --runtime grpc --json grpc.json   # npq, pbm over gRPC

``--runtime grpc`` starts one party program per party (``python -m vfl_lightning.party serve``,
127.0.0.1, a development CA, derived seeds, in a user's environment: without the tests'
``OMP_NUM_THREADS``) and times the same protocol steps against them; its
echo is M no-op party programs over mutual TLS, reached through the runtime's own stream client
(``PartyStream`` on one ``StreamLoop``, as ``GrpcParties`` drives them): per party and round a
``Send`` of 32 packed row indices answered with 500 bytes, and the 2 KB gradient without reply,
held to travel in one stream message with the next ``Send``. ``--json FILE`` writes, per algo, ``local_rps``, ``runtime_rps`` and
``slowdown`` (local_rps / runtime_rps), and ``cpu_ms_per_round``.

A second table gives the CPU milliseconds per round (user + system time of all threads, from
/proc; :mod:`process_cpu`) over the same timed rounds, per process: the server (this process),
each party (program, actor, or the echo's no-op ones), Ray's own processes, their total, and
what the whole machine spent meanwhile (other people's jobs included). On a machine with C
cores a round cannot take less wall time than the total over C, nor less than the busiest
process's share.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("WANDB_MODE", "disabled")

from conftest import compose_config  # noqa: E402
from process_cpu import Window  # noqa: E402

from vfl_lightning import lightning_speedups  # noqa: E402
from vfl_lightning.run.runtimes import make_runtime  # noqa: E402
from vfl_lightning.train import build  # noqa: E402

lightning_speedups.use(True)  # as train() does by default (lightning_speedups=true)


def timed_rounds(one_round, rounds: int, warmup: int) -> tuple[float, dict]:
    """Median seconds of ``one_round()`` over ``rounds`` rounds after ``warmup``, and the CPU
    :class:`Window` of those rounds."""
    times, window = [], Window()
    for i in range(rounds + warmup):
        if i == warmup:
            window.start()
        start = time.perf_counter()
        one_round()
        times.append(time.perf_counter() - start)
    return statistics.median(times[warmup:]), window.end(rounds)


class Echo:
    """A no-op party: replies with a message of the given shape and dtype, acks gradients."""

    def send(self, idx, shape, dtype):
        return torch.zeros(shape, dtype=dtype), 0

    def apply_gradient(self, gradient, fresh, mu):
        return None

    def client_message(self, idx, shape, dtype):
        perturbed = (shape[0] - 1, *shape[1:])
        return (torch.zeros(shape[1:], dtype=dtype), torch.zeros(perturbed, dtype=dtype)), 0

    def answer(self, answer):
        return None

    def exchange(self, calls):
        """The synchronous family's request of a round: the last round's update, this one's
        release (an array, as the party actors send it)."""
        reply = None
        for name, args in calls:
            reply = getattr(self, name)(*args)
        return None if reply is None else (reply[0].numpy(), 0)


CLIENT_PASSES = ("cascade", "zoo_vfl", "vafl")
"""Asynchronous algos whose protocol step (one batch) is M server iterations (algo.epoch=client_pass)."""
PARTY_CALLS = ("send", "apply_gradients", "client_messages", "answer_client", "embed_rows")
"""The party-side calls whose time counts as waiting on the parties."""


def timed_messages(messages, party_s: list[float]):
    """The messages of ``client_messages``, the wait for each one added to ``party_s[-1]``."""
    while True:
        start = time.perf_counter()
        try:
            message = next(messages)
        except StopIteration:
            party_s[-1] += time.perf_counter() - start
            return
        party_s[-1] += time.perf_counter() - start
        yield message


FEDVS_ALGOS = ("fedvs", "fedvs_wait", "fedvs_ignore")
FEDVS_PARTIES = 8
"""``experiment=fedvs_digits``'s clients."""


def protocol_overrides(algo: str, parties: int) -> list[str]:
    """The run's protocol and data (what every party program's configuration holds too)."""
    if algo in FEDVS_ALGOS:
        return ["experiment=fedvs_digits", f"algo={algo}", "algo.max_simulated_s=null"]
    return [
        f"algo={algo}",
        f"data.num_parties={parties}",
        "data.partition=quadrants" if parties == 4 else "data.partition=even",
    ]


def run_overrides(
    algo: str, runtime: str, parties: int, time_scale: float, server: list[str]
) -> list[str]:
    """The server's overrides: the protocol's, and the runtime's (``server``: how to reach the
    party programs under gRPC; Ray's exchange)."""
    overrides = [*protocol_overrides(algo, parties), f"runtime={runtime}"]
    if runtime == "ray" and algo in FEDVS_ALGOS:
        overrides += [f"runtime.time_scale={time_scale}"]
    return overrides + (list(server) if runtime != "local" else [])


def time_run(
    algo: str,
    runtime: str,
    parties: int,
    rounds: int,
    warmup: int,
    out: Path,
    time_scale: float,
    server: list[str] = (),
    cpu: dict | None = None,
):
    """(median seconds per round, median seconds inside party calls per round) over the timed
    protocol steps; a round is a server update (``global_step``). ``cpu`` (a dict) receives the
    CPU seconds per round of this process and each one it started (party programs, Ray's
    processes) over the timed steps, by pid, with ``rounds``, ``wall_s`` and ``machine_s`` (what
    every process of the machine spent meanwhile)."""
    fedvs = algo in FEDVS_ALGOS
    steps = (rounds + warmup) * (parties if algo in CLIENT_PASSES else 1)
    cfg = compose_config(
        out / f"{algo}-{runtime}",
        *run_overrides(algo, runtime, parties, time_scale, list(server)),
        f"trainer.max_steps={steps}",
        "trainer.max_epochs=-1",
        "trainer.limit_val_batches=0",
        "trainer.log_every_n_steps=1000",
        "callbacks.checkpoint=null",
        "test=false",
    )
    L.seed_everything(0)
    handle = make_runtime(cfg)
    handle.start(cfg)
    datamodule, module = build(cfg, handle)
    handle.attach(cfg, module)
    round_s: list[float] = []
    party_s: list[float] = [0.0]
    side = module.party_side
    calls = PARTY_CALLS
    if fedvs:
        calls = ("share_models", "coded_embeddings", "update")
        if algo in ("fedvs_wait", "fedvs_ignore"):
            calls = ("plain_round", "update_plain")
    for name in calls:
        call = getattr(side, name)

        def timed_call(*args, _call=call, _name=name, **kwargs):
            start = time.perf_counter()
            result = _call(*args, **kwargs)
            party_s[-1] += time.perf_counter() - start
            return timed_messages(result, party_s) if _name == "client_messages" else result

        setattr(side, name, timed_call)
    step_name = (
        ("fedvs_round" if algo == "fedvs" else "baseline_round") if fedvs else "protocol_step"
    )
    protocol_step = getattr(module, step_name)

    window = Window()
    steps_at: list[int] = []

    def timed(xs, y, idx):
        if len(round_s) == warmup:
            steps_at.append(module.global_step)
            window.start()
        party_s.append(0.0)
        before = module.global_step
        start = time.perf_counter()
        result = protocol_step(xs, y, idx)
        per_round = 1 / max(1, module.global_step - before)
        round_s.append((time.perf_counter() - start) * per_round)
        party_s[-1] *= per_round
        if len(round_s) == warmup + rounds and cpu is not None:
            cpu.update(window.end(module.global_step - steps_at[0]))
        return result

    setattr(module, step_name, timed)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=steps,
        max_epochs=-1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(module, datamodule=datamodule)
    finally:
        module.party_side.close()
        handle.stop()
    return statistics.median(round_s[warmup:]), statistics.median(party_s[1:][warmup:])


def time_call_echo(parties: int, rounds: int, warmup: int, width: int, batch: int, dtype):
    """Median seconds of a bare round of separate calls (FedVS's transport): M no-op actors,
    message up, then the gradient submitted without waiting, its ack checked after the next
    round's messages are requested."""
    import ray

    actors = [ray.remote(Echo).options(num_cpus=0).remote() for _ in range(parties)]
    idx = torch.arange(batch)
    gradient = torch.zeros(batch, width)
    updates: list = []
    times = []
    for _ in range(rounds + warmup):
        start = time.perf_counter()
        pending = [a.send.remote(idx, (batch, width), dtype) for a in actors]
        ray.get(updates)
        ray.get(pending)
        updates = [a.apply_gradient.remote(gradient, False, 0.0) for a in actors]
        times.append(time.perf_counter() - start)
    ray.get(updates)
    for actor in actors:
        ray.kill(actor)
    return statistics.median(times[warmup:])


def time_echo(
    parties: int,
    rounds: int,
    warmup: int,
    width: int,
    batch: int,
    dtype,
    exchange: str = "tasks",
    cpu: dict | None = None,
):
    """Median seconds of a bare synchronous round: M no-op actors, message up, gradient down,
    as ``RayParties`` does it for the synchronous family (one request per party and round: the
    last round's gradient, a frame of bytes, then this round's release, rows and message as
    arrays; as Ray tasks or on a compiled graph, ``exchange``)."""
    import ray

    from vfl_lightning.runtime.ray_exchange import PartyExchange

    actors = [ray.remote(Echo).options(num_cpus=0).remote() for _ in range(parties)]
    batches = PartyExchange(actors, lambda error: error, exchange)
    idx = torch.arange(batch).numpy()
    gradient = bytes(batch * width * 4 + 40)

    def one_round() -> None:
        batches.call([("send", (idx, (batch, width), dtype))] * parties)
        batches.queue([("apply_gradient", (gradient, False, 0.0))] * parties)

    median, window = timed_rounds(one_round, rounds, warmup)
    if cpu is not None:
        cpu.update(window)
    batches.flush()
    batches.close()
    for actor in actors:
        ray.kill(actor)
    return median


def time_async_echo(parties: int, rounds: int, warmup: int, shape, dtype, answer_size: int):
    """Median seconds per server iteration of a bare asynchronous batch: M no-op actors, one
    query each (c and c_hat of ``shape``), taken in arrival order, an answer submitted to each."""
    import ray

    actors = [ray.remote(Echo).options(num_cpus=0).remote() for _ in range(parties)]
    idx = torch.arange(shape[1])
    answer = torch.zeros(answer_size, dtype=torch.float64)
    updates: list = []
    times = []
    for _ in range(rounds + warmup):
        start = time.perf_counter()
        ray.get(updates)
        pending = [a.client_message.remote(idx, shape, dtype) for a in actors]
        updates = []
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready[0])
            updates.append(actors[len(updates)].answer.remote(answer))
        times.append((time.perf_counter() - start) / parties)
    ray.get(updates)
    for actor in actors:
        ray.kill(actor)
    return statistics.median(times[warmup:])


def echo_round(
    algo: str, parties: int, rounds: int, warmup: int, exchange: str, cpu: dict | None = None
) -> tuple[int, int, float]:
    """(parties, batch, seconds): the bare transport of one round of ``algo`` on digits with the
    default party widths."""
    if algo in FEDVS_ALGOS:
        dtype = torch.int32 if algo == "fedvs" else torch.float32
        return FEDVS_PARTIES, 64, time_call_echo(FEDVS_PARTIES, rounds, warmup, 16, 64, dtype)
    if algo in CLIENT_PASSES:
        # c and q = 1 perturbed output in float64, width 16; the losses [h, h_hat] back
        seconds = time_async_echo(parties, rounds, warmup, (2, 32, 16), torch.float64, 2)
        return parties, 32, seconds
    dtype = torch.uint8 if algo == "pbm" else torch.float32
    return parties, 32, time_echo(parties, rounds, warmup, 16, 32, dtype, exchange, cpu)


ECHO_REPLY_BYTES = 500
"""The echo's reply to a ``Send``: a ``message`` list of this many bytes (a pbm release of 32
rows x 16 at 6 bits packs to about 400)."""


def serve_echo(folder: Path, party: int) -> None:
    """A no-op party program for the gRPC echo: the party program's service and stream method
    (:func:`~vfl_lightning.runtime.grpc_channel.start_server`, mutual TLS with party ``party``'s
    certificate); each stream message's calls are read by name only, and every call that has a
    reply is answered with a fixed frame of its reply schema (``Send``: ``ECHO_REPLY_BYTES``)."""
    import grpc

    from vfl_lightning.mechanisms.certificates import Credentials
    from vfl_lightning.runtime.grpc_channel import (
        SERVICE,
        STREAM,
        call_name,
        framed,
        start_server,
        unbundle,
    )
    from vfl_lightning.runtime.grpc_schema import SESSION
    from vfl_lightning.wire.frames import encode_frame

    files = (folder / "ca.pem", folder / f"party_{party}.pem", folder / f"party_{party}.key")
    own = Credentials.from_files(*files, settings=("ca", "cert", "key"))
    replies = {
        "Open": encode_frame({}),
        "Send": encode_frame(framed(SESSION["Send"][1], {"message": [bytes(ECHO_REPLY_BYTES)]})),
    }

    def echo(requests, context):
        for message in requests:
            for call in unbundle(message):
                reply = replies.get(call_name(call))
                if reply is not None:
                    yield reply

    handler = grpc.method_handlers_generic_handler(
        SERVICE, {STREAM: grpc.stream_stream_rpc_method_handler(echo)}
    )
    server, port = start_server(handler, "127.0.0.1:0", own, workers=4)
    (folder / f"port_{party}").write_text(str(port))
    server.wait_for_termination()


def time_grpc_echo(
    parties: int, rounds: int, warmup: int, out: Path, cpu: dict | None = None
) -> float:
    """Median seconds of a bare gRPC round through the runtime's own transport: the server's
    :class:`~vfl_lightning.runtime.grpc_stream.PartyStream` of each of M no-op party programs
    on one :class:`~vfl_lightning.runtime.grpc_stream.StreamLoop`, as ``GrpcParties`` drives
    them in a pbm round: a ``Send`` of 32 packed row indices to every party, the wait for every
    reply (``ECHO_REPLY_BYTES``), then an ``ApplyGradient`` of 32 x 16 float32 held, to go in one
    stream message with the next round's ``Send``."""
    import subprocess

    from vfl_lightning.mechanisms.certificates import Credentials, write_development_ca
    from vfl_lightning.runtime.grpc_channel import PartyChannel, encode_call
    from vfl_lightning.runtime.grpc_parties import packed_rows
    from vfl_lightning.runtime.grpc_stream import PartyStream, StreamLoop
    from vfl_lightning.wire.codecs import Codec

    folder = out / "echo"
    write_development_ca(folder, parties)
    command = [sys.executable, __file__, "--serve-echo", str(folder)]
    programs = [subprocess.Popen([*command, str(m)]) for m in range(parties)]
    loop, streams = None, []
    try:
        while not all((folder / f"port_{m}").exists() for m in range(parties)):
            time.sleep(0.1)
        files = (folder / "ca.pem", folder / "server.pem", folder / "server.key")
        own = Credentials.from_files(*files, settings=("ca", "cert", "key"))
        loop = StreamLoop()
        for m in range(parties):
            address = f"127.0.0.1:{(folder / f'port_{m}').read_text()}"
            channel = PartyChannel(m, address, own, timeout_s=30)
            streams.append(PartyStream(channel, "0" * 32, None, loop))
        for stream in streams:
            stream.reply()  # Open's
        send = encode_call(
            "Send", {"idx": packed_rows(torch.arange(32)), "stage": "train", "round": 0}
        )
        gradient = {"gradient": Codec().encode(torch.zeros(32, 16)), "fresh": False, "mu": 0.0}
        update = encode_call("ApplyGradient", gradient)

        def one_round() -> None:
            for stream in streams:
                stream.send_encoded("Send", send)
            loop.until(lambda: all(stream.answered() for stream in streams), 30.0)
            for stream in streams:
                stream.reply()
            for stream in streams:
                stream.send_encoded("ApplyGradient", update, hold=True)

        median, window = timed_rounds(one_round, rounds, warmup)
        if cpu is not None:
            cpu.update(window, party_pids=[program.pid for program in programs])
        return median
    finally:
        for stream in streams:
            stream.close(5.0)  # the echo answers the end of the stream by ending its own
            stream.channel.close()
        if loop is not None:
            loop.close()
        for program in programs:
            program.kill()
            program.wait()


def grpc_parties(algo: str, parties: int, out: Path):
    """M party programs for ``algo`` (started), as the tests start them but in the environment a
    user starts them in: without the tests' ``OMP_NUM_THREADS=1`` (each program keeps to the
    ``threads`` of its own configuration)."""
    from grpc_parties import make_deployment

    deployment = make_deployment(out / f"{algo}-parties", protocol_overrides(algo, parties))
    tests_threads = os.environ.pop("OMP_NUM_THREADS", None)
    try:
        deployment.start()
    finally:
        if tests_threads is not None:
            os.environ["OMP_NUM_THREADS"] = tests_threads
    return deployment


def cpu_by_role(cpu: dict, party_pids: dict[int, int]) -> dict:
    """CPU milliseconds per round of the timed window by role: ``server`` (this process),
    ``parties`` (each party program or party actor, in pid order; the echo's no-op ones),
    ``others`` (Ray's own processes, by name), their ``total``, the ``wall`` ms per round, and ``machine`` (every
    process of the machine, other people's jobs included)."""
    if not cpu:
        return {}
    me = os.getpid()
    parties, others = [], {}
    party_pids = set(party_pids) | set(cpu.get("party_pids", ()))
    for pid, seconds in sorted(cpu["processes"].items()):
        name = cpu["names"].get(pid, "?")
        if pid == me:
            continue
        if pid in party_pids or any(kind in name for kind in ("PartyActor", "Client", "Echo")):
            parties.append(seconds * 1e3)
        else:
            key = name.split(".")[0] if name.startswith("ray::") else name
            others[key] = others.get(key, 0.0) + seconds * 1e3
    server = cpu["processes"].get(me, 0.0) * 1e3
    return {
        "rounds": cpu["rounds"],
        "wall": cpu["wall_s"] * 1e3,
        "server": server,
        "parties": parties,
        "others": others,
        "total": server + sum(parties) + sum(others.values()),
        "machine": None if cpu["machine_s"] is None else cpu["machine_s"] * 1e3,
    }


def print_cpu(cpus: dict[str, dict]) -> None:
    """The CPU table: ms of CPU per round by process, over the timed rounds."""
    print("CPU ms per round over the timed rounds (user + system, all threads; /proc)")
    print(
        f"{'algo':12} {'runtime':8} {'wall':>6} {'server':>7} {'parties (each)':>26} "
        f"{'others':>7} {'total':>6} {'machine':>8}"
    )
    for algo, by_runtime in cpus.items():
        for runtime, c in by_runtime.items():
            if not c:
                continue
            each = " ".join(f"{ms:.2f}" for ms in c["parties"]) or "-"
            machine = "-" if c["machine"] is None else f"{c['machine']:.2f}"
            print(
                f"{algo:12} {runtime:8} {c['wall']:6.2f} {c['server']:7.2f} {each:>26} "
                f"{sum(c['others'].values()):7.2f} {c['total']:6.2f} {machine:>8}"
            )
            if sum(c["others"].values()) > 0:
                named = ", ".join(f"{k} {v:.2f}" for k, v in sorted(c["others"].items()))
                print(f"{'':21} others: {named}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--serve-echo":
        serve_echo(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["npq", "pbm"])
    parser.add_argument("--runtime", choices=("ray", "grpc"), default="ray")
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--num-cpus", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=0.01, help="FedVS: runtime.time_scale")
    parser.add_argument(
        "--exchange",
        choices=("tasks", "compiled"),
        default="tasks",
        help="Ray: runtime.exchange (the synchronous family's per-batch requests)",
    )
    parser.add_argument("--json", type=Path, help="write local_rps, runtime_rps, slowdown per algo")
    args = parser.parse_args()
    torch.set_num_threads(1)
    ray_runtime = args.runtime == "ray"
    if ray_runtime:
        import ray

        ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    rows = []
    cpus: dict[str, dict] = {}
    name = args.runtime
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos:
            timing = (args.parties, args.rounds, args.warmup, Path(tmp), args.time_scale)
            local_cpu: dict = {}
            remote_cpu: dict = {}
            echo_cpu: dict = {}
            local, _ = time_run(algo, "local", *timing, cpu=local_cpu)
            echo = None
            party_pids: dict[int, int] = {}
            if ray_runtime:
                exchange = [f"runtime.exchange={args.exchange}"]
                remote, waiting = time_run(algo, "ray", *timing, server=exchange, cpu=remote_cpu)
                parties, batch, echo = echo_round(
                    algo, args.parties, args.rounds, args.warmup, args.exchange, echo_cpu
                )
            else:
                deployment = grpc_parties(algo, args.parties, Path(tmp))
                party_pids = {p.process.pid: p.party for p in deployment.parties}
                try:
                    server = deployment.server_overrides()
                    remote, waiting = time_run(algo, "grpc", *timing, server=server, cpu=remote_cpu)
                finally:
                    deployment.stop()
                parties = len(deployment.parties)
                batch = 64 if algo in FEDVS_ALGOS else 32
                echo = time_grpc_echo(parties, args.rounds, args.warmup, Path(tmp) / algo, echo_cpu)
            rows.append((algo, parties, batch, local, remote, waiting, echo))
            cpus[algo] = {
                "local": cpu_by_role(local_cpu, party_pids),
                name: cpu_by_role(remote_cpu, party_pids),
                "echo": cpu_by_role(echo_cpu, {}),
            }
    if ray_runtime:
        ray.shutdown()
    header = (
        f"{'algo':12} {'M':>2} {'batch':>5} {'local r/s':>10} {name + ' r/s':>9} "
        f"{name + '/local':>10} {'party calls':>11}"
    )
    print(
        f"digits; medians of {args.rounds} protocol steps (a round: a server update); FedVS "
        f"time_scale {args.time_scale}"
    )
    print(header + f" {'echo ms':>8} {'echo share':>10}")
    results = {}
    for algo, parties, batch, local, remote, waiting, echo in rows:
        line = (
            f"{algo:12} {parties:2d} {batch:5d} {1 / local:10.1f} {1 / remote:9.1f} "
            f"{remote / local:10.2f} {waiting / remote:11.0%}"
        )
        if echo is not None:
            line += f" {echo * 1e3:8.2f} {echo / remote:10.0%}"
        print(line)
        results[algo] = {
            "local_rps": 1 / local,
            "runtime_rps": 1 / remote,
            "slowdown": remote / local,
            "runtime": name,
            "parties": parties,
            "batch": batch,
            "echo_ms": echo * 1e3,
            "cpu_ms_per_round": cpus[algo],
        }
    print_cpu(cpus)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
