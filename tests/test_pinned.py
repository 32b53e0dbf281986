"""Pinned values skip, never fail, on a machine other than the one that recorded them."""

from __future__ import annotations

import re

import pinned
import pytest
import test_digests
import test_fedvs

INTEL = {
    **pinned.CI_MACHINE,
    "cpu": "GenuineIntel Intel(R) Xeon(R) Platinum 8480+",
    "cpu_simd_flags": pinned.CI_MACHINE["cpu_simd_flags"] + " amx_bf16 amx_int8 amx_tile",
}


def test_a_pin_skips_on_another_cpu_and_says_what_differs(monkeypatch):
    monkeypatch.setattr(pinned, "fingerprint", lambda: dict(INTEL))
    with pytest.raises(pytest.skip.Exception) as skipped:
        pinned.require_recording_machine(pinned.CI_MACHINE)
    reason = str(skipped.value)
    assert reason.startswith("values pinned on another machine (cpu: here 'GenuineIntel Intel(R)")
    assert "recorded 'AuthenticAMD AMD EPYC'" in reason and "cpu_simd_flags: here" in reason
    assert "torch:" not in reason and "numpy:" not in reason  # only what differs


@pytest.mark.parametrize(
    "key,value", [("torch", "2.14.0+cpu"), ("cpu_capability", "AVX2"), ("numpy", "2.5.0")]
)
def test_a_pin_skips_on_another_build_or_code_path(monkeypatch, key, value):
    monkeypatch.setattr(pinned, "fingerprint", lambda: {**pinned.CI_MACHINE, key: value})
    with pytest.raises(pytest.skip.Exception, match=re.escape(f"{key}: here {value!r}")):
        pinned.require_recording_machine(pinned.CI_MACHINE)


def test_a_pin_runs_where_the_fingerprint_matches(monkeypatch):
    monkeypatch.setattr(pinned, "fingerprint", lambda: dict(pinned.CI_MACHINE))
    assert pinned.require_recording_machine(pinned.CI_MACHINE) is None


def test_the_fingerprint_reads_this_machine():
    here = pinned.fingerprint()
    assert set(here) == set(pinned.CI_MACHINE)
    assert all(isinstance(value, str) and value for key, value in here.items() if key != "libc")


@pytest.mark.parametrize(
    "call",
    [
        lambda tmp_path: test_digests.test_reference_digest(tmp_path, "algo=pbm"),
        lambda tmp_path: test_fedvs.test_clock_values_are_pinned(None, "fedvs"),
    ],
    ids=["digests", "clock"],
)
def test_pinned_tests_skip_before_training_on_another_machine(monkeypatch, tmp_path, call):
    """The skip comes first: on another machine nothing trains and nothing is compared."""

    def no_training(*args, **kwargs):
        raise AssertionError("trained on a machine the values were not recorded on")

    monkeypatch.setattr(pinned, "fingerprint", lambda: dict(INTEL))
    monkeypatch.setattr(test_digests, "train", no_training)
    monkeypatch.setattr(test_fedvs, "run", no_training)
    with pytest.raises(pytest.skip.Exception, match="values pinned on another machine"):
        call(tmp_path)
