"""The one clock of a search (amp_opt.search.clock): the reserve, shares, and stops."""

import time

import pytest

from amp_opt.search import stop
from amp_opt.search.clock import NO_LIMIT, Clock, reserve
from amp_opt.search.tuning import RESERVE


def test_the_reserve_is_taken_once_from_the_callers_limit():
    clock = Clock.of(10.0, started=100.0)
    assert reserve(10.0) == min(RESERVE[0] * 10.0, RESERVE[1]) == 0.25
    assert clock.deadline == 100.0 + 10.0 - 0.25 and clock.end == 110.0 and clock.limit == 10.0
    assert Clock.of(1.0, started=0.0).deadline == pytest.approx(0.95)
    # A child keeps the caller's limit and end: its messages name the caller's limit.
    child = clock.part(0.5)
    assert child.limit == 10.0 and child.end == 110.0 and child.deadline == pytest.approx(100.0 + 0.5 * 9.75)


def test_without_a_limit_every_share_is_unlimited():
    clock = Clock.of(None)
    assert clock.deadline is None and clock.remaining() is None and not clock.out_of_time()
    for child in (clock.share(0.5), clock.share(among=3, floor=1.0), clock.part(0.6), clock.less(5.0),
                  clock.at_least(0.01)):
        assert child.deadline is None
    assert clock.budget is None and clock.overrun() is None


def test_a_share_is_a_fraction_of_what_is_left_within_its_floor_and_what_is_left():
    now = time.perf_counter()
    clock = Clock(now, now + 100.0)
    half = clock.share(0.5)
    assert half.deadline == pytest.approx(now + 50.0, abs=0.05)
    third = clock.share(among=3)
    assert third.deadline == pytest.approx(now + 100.0 / 3, abs=0.05)
    more = clock.share(1.5, among=1)  # never more than is left
    assert more.deadline <= clock.deadline
    floored = clock.share(among=10_000, floor=2.0)
    assert floored.deadline == pytest.approx(now + 2.0, abs=0.05)
    spent = Clock(now - 10.0, now - 1.0)
    assert spent.out_of_time() and spent.remaining() == 0.0
    assert spent.share(floor=0.05).deadline == pytest.approx(time.perf_counter() + 0.05, abs=0.02)


def test_less_within_and_at_least_move_the_deadline_as_named():
    now = time.perf_counter()
    clock = Clock(now, now + 10.0)
    assert clock.less(3.0).deadline == pytest.approx(now + 7.0)
    assert clock.less(30.0, floor=0.01).deadline == pytest.approx(now + 0.01)
    assert clock.within(1.0).deadline == pytest.approx(now + 1.0, abs=0.05)
    assert clock.within(100.0).deadline == clock.deadline
    assert clock.at_least(0.5).deadline == clock.deadline
    late = Clock(now - 5.0, now - 1.0)
    assert late.at_least(0.5).deadline == pytest.approx(time.perf_counter() + 0.5, abs=0.05)
    assert not late.at_least(0.5).out_of_time()


def test_a_stop_request_ends_every_clock():
    clock = Clock.of(60.0)
    try:
        stop.request("SIGINT")
        assert clock.out_of_time() and NO_LIMIT.out_of_time() and clock.share(0.5).out_of_time()
        assert clock.remaining() == 0.0 and clock.stopped_why() == "interrupted by SIGINT"
    finally:
        stop.clear()
    assert not clock.out_of_time() and clock.stopped_why() == "time limit of 60 s"


def test_helpers_are_waited_for_halfway_into_the_reserve():
    clock = Clock.of(10.0, started=0.0)
    assert clock.overrun() == pytest.approx(10.0 - 0.25 / 2)


def test_the_callers_clock_reaches_every_backend_and_no_deadline_passes_its(paper_instances, monkeypatch):
    """The time limit becomes one clock at amp_opt.solve; the backend gets a child of it (the
    caller's limit, a deadline no later than the search's) and turns it into seconds itself."""
    import amp_opt
    from amp_opt.search.mip import backends

    seen = []
    solve = backends.BACKENDS["cpsat"]

    def recorded(program, clock, settings):
        seen.append(clock)
        return solve(program, clock, settings)

    monkeypatch.setitem(backends.BACKENDS, "cpsat", recorded)
    started = time.perf_counter() - 5.0  # as if the process had started 5 s ago
    result = amp_opt.solve(paper_instances["het_cluster"], solver="cpsat", time_limit=30.0, started=started)
    assert seen and result.best.feasible
    top = Clock.of(30.0, started)
    for clock in seen:
        assert clock.limit == 30.0 and clock.end == top.end
        assert clock.deadline <= top.deadline + 0.011  # a solver's floor of 0.01 s at most past it
