"""bench/phase_clock.py: each second is counted once, in the innermost watched method running;
the methods are put back afterwards; every method a run's breakdown watches exists."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from phase_clock import PhaseClock, party_check_phases, run_phases  # noqa: E402


class Clock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Loop:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def advance(self) -> None:
        self.clock.now += 1.0  # the loop's own work
        self.step()
        self.clock.now += 2.0

    def step(self) -> None:
        self.clock.now += 10.0

    def evaluate(self) -> None:
        self.clock.now += 100.0


def test_nested_phases_take_their_own_time_out_of_the_outer_one():
    ticks = Clock()
    clock = PhaseClock(ticks)
    loop = Loop(ticks)

    def run() -> None:
        ticks.now += 1000.0  # outside every watched method
        loop.advance()
        loop.advance()
        loop.evaluate()

    methods = {(Loop, "advance"): "batch", (Loop, "step"): "step", (Loop, "evaluate"): "eval"}
    with clock.watch(methods):
        phases = clock.measure(run)
    assert phases == {"batch": 6.0, "step": 20.0, "eval": 100.0, "other": 1000.0, "total": 1126.0}
    assert clock.calls == {"batch": 2, "step": 2, "eval": 1}


def test_the_methods_are_put_back_even_after_an_error():
    originals = dict(vars(Loop))
    with pytest.raises(RuntimeError), PhaseClock(Clock()).watch({(Loop, "step"): "step"}):
        assert Loop.step is not originals["step"]
        raise RuntimeError("stop")
    assert Loop.step is originals["step"] and Loop.advance is originals["advance"]


def test_a_method_the_class_does_not_define_itself_is_refused():
    class Child(Loop):
        pass

    with pytest.raises(KeyError), PhaseClock(Clock()).watch({(Child, "step"): "step"}):
        pass
    assert "step" not in vars(Child)


def test_every_method_of_a_run_breakdown_is_defined_by_its_class():
    methods = run_phases()
    assert set(methods.values()) == {"step", "batch", "evaluation", "checkpoint"}
    for owner, name in methods:
        assert callable(vars(owner).get(name)), f"{owner.__name__}.{name}"


def test_every_party_check_the_cost_bench_watches_is_defined_where_it_is_looked_up():
    """bench/party_check_cost.py wraps these: a renamed check or a module that no longer looks
    one up by that name would leave its time uncounted."""
    checks = party_check_phases()
    assert "checked_gradients" in checks.values() and "record_release" in checks.values()
    for owner, name in checks:
        assert callable(vars(owner).get(name)), f"{owner.__name__}.{name}"
