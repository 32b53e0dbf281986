"""CPU seconds of this process and of every process it started (its descendants), read from
Linux's /proc (user + system time of all their threads): what a benchmark's window cost each
process, not only how long it took. Elsewhere :func:`snapshot` is empty."""

from __future__ import annotations

import os
import time
from pathlib import Path

TICK_S = 1 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of ``pid``; None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S


def name_of(pid: int) -> str:
    """A short name of ``pid``'s program: its command line's first word (Ray names its workers
    ``ray::<Class>``), or the kernel's name."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        first = os.path.basename(words[0].decode(errors="replace"))
        if first.startswith("python") and len(words) > 1 and words[1] == b"-m":
            return words[2].decode(errors="replace")
        return first or Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def snapshot(root: int | None = None) -> dict[int, float]:
    """CPU seconds of ``root`` (default: this process) and each of its descendants, by pid."""
    root = os.getpid() if root is None else root
    proc = Path("/proc")
    if not proc.is_dir():
        return {}
    stats = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            stat = _stat(int(entry.name))
            if stat is not None:
                stats[int(entry.name)] = stat
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    found, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in stats:
            found[pid] = stats[pid][1]
            todo += children.get(pid, [])
    return found


def machine_busy_s() -> float | None:
    """CPU seconds the whole machine has been busy (every core, every process: /proc/stat's
    user, nice, system, irq and softirq time; not idle, iowait, or time a virtual machine's
    host ran something else, steal); None where /proc/stat is missing."""
    try:
        line = Path("/proc/stat").read_text().splitlines()[0]
    except OSError:
        return None
    user, nice, system, _, _, irq, softirq = (int(v) for v in line.split()[1:8])
    return (user + nice + system + irq + softirq) * TICK_S


def spent(before: dict[int, float], after: dict[int, float]) -> dict[int, float]:
    """CPU seconds each process spent between two snapshots (processes present in both)."""
    return {pid: after[pid] - before[pid] for pid in after if pid in before}


class Window:
    """CPU seconds per round of this process and its descendants between :meth:`start` and
    :meth:`end` (``rounds`` rounds), with the wall time and the whole machine's busy time."""

    def start(self) -> None:
        self.first = (time.perf_counter(), machine_busy_s(), snapshot())

    def end(self, rounds: int) -> dict:
        """``rounds``, ``wall_s``, ``machine_s`` (None without /proc/stat), ``processes`` (pid ->
        CPU seconds) per round, and ``names`` (pid -> :func:`name_of`)."""
        wall1, busy1, cpu1 = time.perf_counter(), machine_busy_s(), snapshot()
        wall0, busy0, cpu0 = self.first
        n = max(1, rounds)
        return {
            "rounds": rounds,
            "wall_s": (wall1 - wall0) / n,
            "machine_s": None if busy0 is None or busy1 is None else (busy1 - busy0) / n,
            "processes": {pid: seconds / n for pid, seconds in spent(cpu0, cpu1).items()},
            "names": {pid: name_of(pid) for pid in cpu1},
        }
