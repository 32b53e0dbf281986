"""The Ray fixture's start: a local instance that misses its startup deadline is started again."""

import conftest
import pytest


class FlakyRay:
    def __init__(self, failures: int):
        self.failures, self.calls = failures, []

    def init(self, **options):
        self.calls.append("init")
        if self.failures:
            self.failures -= 1
            raise RuntimeError("Timed out waiting for file /tmp/ray/session_x/gcs_server_port_y")

    def shutdown(self):
        self.calls.append("shutdown")


def test_a_start_that_timed_out_is_tried_again(monkeypatch):
    monkeypatch.setattr(conftest.time, "sleep", lambda seconds: None)
    ray = FlakyRay(failures=2)
    conftest.start_ray(ray)
    assert ray.calls == ["init", "shutdown", "init", "shutdown", "init"]


def test_a_start_that_keeps_failing_raises_its_error(monkeypatch):
    monkeypatch.setattr(conftest.time, "sleep", lambda seconds: None)
    ray = FlakyRay(failures=3)
    with pytest.raises(RuntimeError, match="Timed out waiting for file"):
        conftest.start_ray(ray)
    assert ray.calls.count("init") == 3
