"""Consuming a dataset at simulated step times (:mod:`gm_core.sim.consume`): the queue's pull
split against static ranks, on trajectories written by hand and drawn by hypothesis; and the
simulated fleet bench_queue --sim reads them from."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gm_core.sim import consume, experiments, world


def steady(step_s: float, count: int, start_s: float = 0.0) -> list[float]:
    """A learner that never stalls: its steps end every ``step_s``."""
    return [start_s + step_s * (k + 1) for k in range(count)]


def test_half_twice_as_slow_the_queue_meets_the_ideal_and_ranks_wait_for_the_slow() -> None:
    step_s = {"a": 1.0, "b": 2.0, "c": 1.0, "d": 2.0}
    ends = {n: steady(s, 200) for n, s in step_s.items()}
    ideal = consume.ideal_s(step_s, units=24, batches=4)
    assert ideal == 32.0  # 96 steps at 3 steps per second
    queue = consume.pulled(ends, step_s, units=24, batches=4)
    ranks = consume.static(ends, step_s, units=24, batches=4)
    assert queue is not None
    assert ranks is not None
    assert queue.took_s == 32.0  # fast 8 units each, slow 4: exactly the speed-weighted split
    assert queue.units == {"a": 8, "b": 4, "c": 8, "d": 4}
    assert ranks.took_s == 48.0  # 6 units each: the slow ones' 24 steps of 2 s
    assert ranks.units == {"a": 6, "b": 6, "c": 6, "d": 6}


def test_the_queues_own_requests_delay_every_later_step() -> None:
    step_s = {"a": 1.0}
    got = consume.pulled({"a": steady(1.0, 20)}, step_s, units=3, batches=2, overhead_s=0.5)
    assert got is not None
    assert got.took_s == 6.0 + 3 * 0.5


def test_requests_behind_a_unit_delay_the_next_only_past_the_units_own_training() -> None:
    step_s = {"a": 1.0}
    ends = {"a": steady(1.0, 20)}
    hidden = consume.pulled(ends, step_s, units=3, batches=2, behind_s=1.5)
    assert hidden is not None
    assert hidden.took_s == 6.0  # 1.5 s of requests behind 2 s units: none shows
    showing = consume.pulled(ends, step_s, units=3, batches=2, behind_s=2.5, first_s=0.25)
    assert showing is not None
    assert showing.took_s == 6.0 + 0.25 + 3 * 0.5


def test_a_trajectory_too_short_for_the_dataset_says_so() -> None:
    step_s = {"a": 1.0, "b": 1.0}
    ends = {"a": steady(1.0, 5), "b": steady(1.0, 5)}
    assert consume.pulled(ends, step_s, units=3, batches=4) is None
    assert consume.static(ends, step_s, units=3, batches=4) is None
    assert consume.pulled(ends, step_s, units=2, batches=4) is not None


def test_a_stalled_learner_gets_fewer_units_from_the_queue() -> None:
    step_s = {"a": 1.0, "b": 1.0}
    stalled = [*steady(1.0, 4), *steady(1.0, 40, start_s=20.0)]  # 16 s without a step
    got = consume.pulled({"a": steady(1.0, 60), "b": stalled}, step_s, units=10, batches=4)
    assert got is not None
    assert got.units["a"] > got.units["b"]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="units 0"):
        consume.pulled({"a": [1.0]}, {"a": 1.0}, units=0, batches=1)
    with pytest.raises(ValueError, match="overhead -1"):
        consume.pulled({"a": [1.0]}, {"a": 1.0}, units=1, batches=1, overhead_s=-1)
    with pytest.raises(ValueError, match="behind -1"):
        consume.pulled({"a": [1.0]}, {"a": 1.0}, units=1, batches=1, behind_s=-1)


trajectories = st.dictionaries(
    st.sampled_from("abcd"),
    st.tuples(
        st.floats(0.1, 3.0),
        st.lists(st.floats(0.0, 5.0), min_size=1, max_size=60),
    ),
    min_size=1,
)
"""Per learner: a mean step time and its step gaps beyond it (stalls)."""


def built(
    drawn: dict[str, tuple[float, list[float]]],
) -> tuple[dict[str, list[float]], dict[str, float]]:
    step_s = {n: s for n, (s, _) in drawn.items()}
    ends = {
        n: list(itertools.accumulate(s + gap for gap in gaps)) for n, (s, gaps) in drawn.items()
    }
    return ends, step_s


@given(
    trajectories, st.integers(1, 12), st.integers(1, 4), st.floats(0.0, 1.0), st.floats(0.0, 3.0)
)
def test_every_unit_is_trained_once_and_nothing_beats_the_trajectories(
    drawn: dict[str, tuple[float, list[float]]],
    units: int,
    batches: int,
    overhead_s: float,
    behind_s: float,
) -> None:
    ends, step_s = built(drawn)
    origin = consume.start_s(ends, step_s)
    shares = {n: len(range(r, units, len(ends))) for r, n in enumerate(sorted(ends))}
    fits = all(c * batches <= len(ends[n]) for n, c in shares.items())
    assert (consume.static(ends, step_s, units, batches) is not None) == fits
    for got in (
        consume.pulled(ends, step_s, units, batches, overhead_s, behind_s=behind_s),
        consume.static(ends, step_s, units, batches),
    ):
        if got is None:
            continue  # the trajectories end first
        assert sum(got.units.values()) == units
        assert got.took_s >= 0
        # The last unit ends at some learner's step end (plus overheads), never before it.
        latest = max(ends[n][c * batches - 1] for n, c in got.units.items() if c)
        assert origin + got.took_s >= latest - 1e-9


@given(st.lists(st.floats(0.1, 3.0), min_size=1, max_size=4), st.integers(1, 12), st.integers(1, 4))
def test_steady_learners_the_queue_is_within_one_unit_of_the_ideal_and_beats_ranks(
    speeds: list[float], units: int, batches: int
) -> None:
    step_s = {f"n{i}": s for i, s in enumerate(speeds)}
    ends = {n: steady(s, units * batches) for n, s in step_s.items()}
    queue = consume.pulled(ends, step_s, units, batches)
    ranks = consume.static(ends, step_s, units, batches)
    assert queue is not None
    assert ranks is not None
    slowest_unit = max(speeds) * batches
    ideal = consume.ideal_s(step_s, units, batches)
    assert ideal - 1e-9 <= queue.took_s <= ideal + slowest_unit + 1e-9
    assert queue.took_s <= ranks.took_s + 1e-9


def test_slow_learners_with_follow_keep_training_in_the_simulator() -> None:
    """The bench's fleet, follow=1: a slow learner that finds a marker asks to hear of its
    next step while the simulated shell was already past the step its core knew of. The
    model cluster moved its step counter back to that barrier, and the simulator never
    planned another step: both slow learners stopped after two steps, for good."""
    scenario = experiments.two_speed_fleet(duration_s=3.0, grace_seconds=0.1, follow=1)
    report = world.run(scenario)
    assert report.ok, report.violations
    slow = [len(report.step_ends[n]) for n in ("l00", "l01")]
    fast = [len(report.step_ends[n]) for n in ("l02", "l03")]
    assert min(slow) >= 10, (slow, fast)
    assert min(fast) > max(slow)  # twice as fast, and not held to the slow ones' pace
