"""Values pinned on one machine: what they depend on, and a skip everywhere else.

A float computed by training (a parameter digest, a sum of sampled delays) is exact only for the
floating-point kernels that computed it: the torch build and version, the CPU code path torch and
MKL pick (MKL chooses by CPU vendor and instruction set), numpy's distributions and the C
library's math. A test pinning such a value records :func:`fingerprint` beside it and calls
:func:`require_recording_machine` first: on the machine that recorded it the test runs and guards
every bit; on any other machine it skips, naming what differs. Runs use one intra-op thread
(``torch_threads: 1``), so the machine's thread count is not part of the fingerprint.

``python tests/pinned.py`` prints this machine's fingerprint, to record beside re-pinned values.
"""

from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

import numpy as np
import pytest
import torch

SIMD_FLAG_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx")

CI_MACHINE = {
    "torch": "2.13.0+cpu",
    "torch_build": "76efcb828dca63fb",
    "cpu_capability": "AVX512",
    "cpu": "AuthenticAMD AMD EPYC",
    "cpu_simd_flags": "avx avx2 avx512_bf16 avx512_bitalg avx512_vbmi2 avx512_vnni "
    "avx512_vpopcntdq avx512bw avx512cd avx512dq avx512f avx512ifma avx512vbmi avx512vl f16c fma "
    "sse sse2 sse4_1 sse4_2 sse4a ssse3",
    "numpy": "2.4.6",
    "libc": "glibc 2.36",
}
"""``python tests/pinned.py`` on the project's CI machine (2-core AMD EPYC), where the values
pinned in ``tests/test_digests.py`` and ``tests/test_fedvs.py`` were recorded."""


def _cpuinfo() -> dict[str, str]:
    """The first processor's fields from /proc/cpuinfo (empty where there is none)."""
    fields: dict[str, str] = {}
    path = Path("/proc/cpuinfo")
    if not path.exists():
        return fields
    for line in path.read_text().splitlines():
        if not line.strip():
            break
        key, _, value = line.partition(":")
        fields[key.strip()] = value.strip()
    return fields


def fingerprint() -> dict[str, str]:
    """What a pinned float depends on, as this machine reports it."""
    info = _cpuinfo()
    flags = sorted(f for f in info.get("flags", "").split() if f.startswith(SIMD_FLAG_PREFIXES))
    build = torch.__config__.show()
    return {
        "torch": torch.__version__,
        "torch_build": hashlib.sha256(build.encode()).hexdigest()[:16],
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": f"{info.get('vendor_id', platform.machine())} {info.get('model name', '')}".strip(),
        "cpu_simd_flags": " ".join(flags),
        "numpy": np.__version__,
        "libc": " ".join(platform.libc_ver()),
    }


def differences(recorded: dict[str, str], here: dict[str, str]) -> list[str]:
    """``key: here 'x', recorded 'y'`` for every key of ``recorded`` this machine differs in."""
    return [
        f"{key}: here {here.get(key)!r}, recorded {value!r}"
        for key, value in recorded.items()
        if here.get(key) != value
    ]


def require_recording_machine(recorded: dict[str, str]) -> None:
    """Skip the calling test unless this machine's :func:`fingerprint` equals ``recorded``."""
    differ = differences(recorded, fingerprint())
    if differ:
        pytest.skip("values pinned on another machine (" + "; ".join(differ) + ")")


if __name__ == "__main__":
    print(json.dumps(fingerprint(), indent=4))
