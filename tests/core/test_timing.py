"""Property tests for gm_core.timing: EMAs, the grace window and the takeover timeout."""

from __future__ import annotations

import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gm_core import timing
from gm_core.records import AlgorithmConfig, Timing
from gm_core.timing import (
    EMA_DECAY,
    MAX_ESTIMATE_S,
    OUTLIER_FACTOR,
    OUTLIER_SLACK_S,
    ahead_steps,
    ema,
    grace_s,
    outlier_bound,
    takeover_timeout_s,
    update_timing,
)

DURATION = st.floats(0.0, 1e4)
ESTIMATE = st.none() | DURATION
CORRUPT = st.sampled_from([math.nan, math.inf, -math.inf, -1.0, MAX_ESTIMATE_S * 2])
TIMINGS = st.builds(Timing, step_s=ESTIMATE, quorum_s=ESTIMATE, sync_s=ESTIMATE)
FULL_TIMINGS = st.builds(Timing, step_s=DURATION, quorum_s=DURATION, sync_s=DURATION)
STEPS = st.integers(0, 10**4)
GAMMA = st.floats(0.0, 10.0)
DECAY = st.floats(1e-6, 1.0)


# -- ema -------------------------------------------------------------------------------


@given(DURATION, DECAY)
def test_first_sample_is_taken_as_is(sample: float, decay: float) -> None:
    assert ema(None, sample, decay) == sample


@given(DURATION, DURATION, DECAY)
def test_ema_lies_between_previous_and_sample(previous: float, sample: float, decay: float) -> None:
    value = ema(previous, sample, decay)
    assert min(previous, sample) <= value <= max(previous, sample)
    counted = min(sample, outlier_bound(previous))
    assert math.isclose(value, (1 - decay) * previous + decay * counted, rel_tol=1e-9, abs_tol=1e-9)


@given(DURATION, DURATION)
def test_default_decay_and_extremes(previous: float, sample: float) -> None:
    assert ema(previous, sample) == ema(previous, sample, EMA_DECAY)
    assert ema(previous, sample, 1.0) == min(sample, outlier_bound(previous))
    assert ema(previous, previous) == previous


@given(DURATION, st.floats(0.0, 1e300), DECAY)
def test_one_sample_raises_an_estimate_by_a_bounded_factor(
    previous: float, sample: float, decay: float
) -> None:
    """Bounded influence: an outlier of any size moves the estimate at most d·(c−1) up."""
    limit = previous * (1 + decay * (OUTLIER_FACTOR - 1)) + decay * OUTLIER_SLACK_S
    assert ema(previous, sample, decay) <= limit * (1 + 1e-12)


@given(DURATION, DURATION, DECAY)
def test_lowering_is_never_limited(previous: float, sample: float, decay: float) -> None:
    assume(sample <= previous)
    plain = (1 - decay) * previous + decay * sample
    assert math.isclose(ema(previous, sample, decay), plain, rel_tol=1e-9, abs_tol=1e-12)


@given(st.floats(1e-3, 1e3), st.floats(1.0, 1e6))
def test_a_pause_is_forgotten_within_a_round(step_s: float, pause_factor: float) -> None:
    """One report that held a pause of any length: the next estimate is within 10% (+1 ms)."""
    after = ema(step_s, step_s * pause_factor)
    assert after <= 1.1 * step_s + EMA_DECAY * OUTLIER_SLACK_S + 1e-12
    assert ema(after, step_s) <= after  # and every normal sample brings it back down


@given(st.floats(1e-3, 1e3), st.floats(1.5, 10.0))
def test_a_lasting_slowdown_is_followed(step_s: float, slowdown: float) -> None:
    value, samples = step_s, 0
    while value < 0.95 * step_s * slowdown:
        value = ema(value, step_s * slowdown)
        samples += 1
    assert samples <= math.ceil(math.log(slowdown) / math.log(1.1)) + 30


@given(DURATION, DURATION)
def test_ema_converges_to_a_steady_sample(start: float, sample: float) -> None:
    value = start
    for _ in range(400):
        value = ema(value, sample)
    assert math.isclose(value, sample, rel_tol=1e-9, abs_tol=1e-9)


@given(CORRUPT, DURATION)
def test_corrupt_previous_is_treated_as_missing(previous: float, sample: float) -> None:
    assert ema(previous, sample) == sample


@given(st.floats(MAX_ESTIMATE_S, 1e300), ESTIMATE)
def test_huge_samples_are_clamped(sample: float, previous: float | None) -> None:
    assert ema(previous, sample) <= MAX_ESTIMATE_S
    assert ema(None, sample) == MAX_ESTIMATE_S


@given(st.sampled_from([math.nan, math.inf, -1.0, -1e-9]), ESTIMATE)
def test_bad_samples_raise(sample: float, previous: float | None) -> None:
    with pytest.raises(ValueError, match="sample"):
        ema(previous, sample)


@given(st.floats(allow_nan=True), DURATION)
def test_bad_decay_raises(decay: float, sample: float) -> None:
    assume(not 0.0 < decay <= 1.0)
    with pytest.raises(ValueError, match="decay"):
        ema(1.0, sample, decay)


# -- update_timing ---------------------------------------------------------------------


@given(TIMINGS, ESTIMATE, ESTIMATE, ESTIMATE)
def test_update_timing_folds_each_given_sample(
    timing: Timing, step: float | None, quorum: float | None, sync: float | None
) -> None:
    updated = update_timing(timing, step_s=step, quorum_s=quorum, sync_s=sync)
    for old, sample, new in [
        (timing.step_s, step, updated.step_s),
        (timing.quorum_s, quorum, updated.quorum_s),
        (timing.sync_s, sync, updated.sync_s),
    ]:
        assert new == (old if sample is None else ema(old, sample))


@given(TIMINGS)
def test_update_timing_without_samples_is_identity(timing: Timing) -> None:
    assert update_timing(timing) == timing


# -- grace_s ---------------------------------------------------------------------------


def reference_grace(t: Timing, ahead: int, gap: int, gamma: float) -> float:
    assert t.step_s is not None
    assert t.quorum_s is not None
    assert t.sync_s is not None
    return min(gamma * max(ahead * t.step_s - (t.quorum_s + t.sync_s), 0.0), gap * t.step_s)


@given(FULL_TIMINGS, STEPS, STEPS, GAMMA)
def test_grace_formula_and_bounds(timing: Timing, ahead: int, gap: int, gamma: float) -> None:
    grace = grace_s(timing, ahead_steps=ahead, gap_steps=gap, gamma=gamma)
    assert grace == reference_grace(timing, ahead, gap, gamma)
    assert timing.step_s is not None
    assert 0.0 <= grace <= gap * timing.step_s


@given(TIMINGS, STEPS, STEPS, GAMMA)
def test_grace_is_zero_while_an_estimate_is_missing(
    timing: Timing, ahead: int, gap: int, gamma: float
) -> None:
    assume(None in (timing.step_s, timing.quorum_s, timing.sync_s))
    assert grace_s(timing, ahead_steps=ahead, gap_steps=gap, gamma=gamma) == 0.0


@given(
    FULL_TIMINGS, st.sampled_from(["step_s", "quorum_s", "sync_s"]), CORRUPT, STEPS, STEPS, GAMMA
)
def test_grace_is_zero_for_corrupt_estimates(
    timing: Timing, field: str, bad: float, ahead: int, gap: int, gamma: float
) -> None:
    corrupt = Timing(**{**_as_dict(timing), field: bad})
    assert grace_s(corrupt, ahead_steps=ahead, gap_steps=gap, gamma=gamma) == 0.0


def _as_dict(timing: Timing) -> dict[str, float | None]:
    return {"step_s": timing.step_s, "quorum_s": timing.quorum_s, "sync_s": timing.sync_s}


@given(FULL_TIMINGS, STEPS, STEPS, GAMMA, GAMMA)
def test_grace_is_monotone_in_gamma(
    timing: Timing, ahead: int, gap: int, g1: float, g2: float
) -> None:
    low, high = sorted((g1, g2))
    assert grace_s(timing, ahead_steps=ahead, gap_steps=gap, gamma=low) <= grace_s(
        timing, ahead_steps=ahead, gap_steps=gap, gamma=high
    )


@given(FULL_TIMINGS, STEPS, STEPS, STEPS, GAMMA)
def test_grace_is_monotone_in_ahead(
    timing: Timing, a1: int, a2: int, gap: int, gamma: float
) -> None:
    low, high = sorted((a1, a2))
    assert grace_s(timing, ahead_steps=low, gap_steps=gap, gamma=gamma) <= grace_s(
        timing, ahead_steps=high, gap_steps=gap, gamma=gamma
    )


def test_grace_example() -> None:
    # 1 s steps, 3 s to quorum, 1 s to commit; 10 steps of slack ahead → 6 s left, half: 3 s.
    timing = Timing(step_s=1.0, quorum_s=3.0, sync_s=1.0)
    assert grace_s(timing, ahead_steps=10, gap_steps=5, gamma=0.5) == 3.0
    assert grace_s(timing, ahead_steps=10, gap_steps=2, gamma=0.5) == 2.0  # capped by gap
    assert grace_s(timing, ahead_steps=3, gap_steps=5, gamma=0.5) == 0.0  # no slack


@given(FULL_TIMINGS, st.integers(max_value=-1), st.floats(max_value=-1e-9) | st.just(math.nan))
def test_grace_misuse_raises(timing: Timing, bad: int, bad_gamma: float) -> None:
    with pytest.raises(ValueError, match="ahead_steps"):
        grace_s(timing, ahead_steps=bad, gap_steps=1, gamma=0.5)
    with pytest.raises(ValueError, match="gap_steps"):
        grace_s(timing, ahead_steps=1, gap_steps=bad, gamma=0.5)
    with pytest.raises(ValueError, match="gamma"):
        grace_s(timing, ahead_steps=1, gap_steps=1, gamma=bad_gamma)


@given(TIMINGS | FULL_TIMINGS, STEPS, st.floats(0.0, 86_400.0))
def test_a_fixed_grace_window_ignores_the_estimates(t: Timing, gap: int, seconds: float) -> None:
    """``grace_seconds`` (issue 13 item 6): the window is the run's number, measured or not,
    for any gap; without it, the adaptive window of ``grace_gamma``."""
    fixed = AlgorithmConfig(sync_every=100, fragments=4, grace_seconds=seconds)
    assert timing.window_s(t, fixed, gap) == seconds
    adaptive = AlgorithmConfig(sync_every=100, fragments=4, grace_gamma=0.5)
    expected = grace_s(t, ahead_steps=ahead_steps(adaptive, gap), gap_steps=gap, gamma=0.5)
    assert timing.window_s(t, adaptive, gap) == expected


# -- ahead_steps -----------------------------------------------------------------------


@given(st.integers(1, 8), st.none() | st.integers(0, 10**4), STEPS)
def test_ahead_steps(in_flight: int, overlap: int | None, gap: int) -> None:
    config = AlgorithmConfig(
        sync_every=100, fragments=4, in_flight=in_flight, overlap_steps=overlap
    )
    ahead = ahead_steps(config, gap)
    assert ahead == (in_flight * gap if overlap is None else min(overlap, in_flight * gap))
    assert 0 <= ahead <= in_flight * gap
    assert ahead_steps(config, gap + 1) >= ahead


@given(st.integers(max_value=-1))
def test_ahead_steps_misuse_raises(bad: int) -> None:
    config = AlgorithmConfig(sync_every=100, fragments=4)
    with pytest.raises(ValueError, match="gap_steps"):
        ahead_steps(config, bad)
    with pytest.raises(ValueError, match="in_flight"):
        ahead_steps(AlgorithmConfig(sync_every=100, fragments=4, in_flight=bad + 1), 1)
    with pytest.raises(ValueError, match="overlap_steps"):
        ahead_steps(AlgorithmConfig(sync_every=100, fragments=4, overlap_steps=bad), 1)


# -- takeover_timeout_s ----------------------------------------------------------------

FLOOR = st.floats(0.0, 1e3)
FACTOR = st.floats(0.0, 10.0)


@given(FULL_TIMINGS, STEPS, FLOOR, FACTOR)
def test_takeover_timeout_formula(timing: Timing, gap: int, floor: float, factor: float) -> None:
    assert timing.step_s is not None
    assert timing.quorum_s is not None
    assert timing.sync_s is not None
    expected = max(floor, factor * (gap * timing.step_s + timing.quorum_s + timing.sync_s))
    timeout = takeover_timeout_s(timing, gap_steps=gap, floor_s=floor, factor=factor)
    assert timeout == expected
    assert timeout >= floor


@given(TIMINGS, STEPS, FLOOR, FACTOR)
def test_takeover_timeout_is_floor_while_unmeasured(
    timing: Timing, gap: int, floor: float, factor: float
) -> None:
    assume(None in (timing.step_s, timing.quorum_s, timing.sync_s))
    assert takeover_timeout_s(timing, gap_steps=gap, floor_s=floor, factor=factor) == floor


@given(FULL_TIMINGS, st.sampled_from(["step_s", "quorum_s", "sync_s"]), CORRUPT, STEPS, FLOOR)
def test_takeover_timeout_is_floor_for_corrupt_estimates(
    timing: Timing, field: str, bad: float, gap: int, floor: float
) -> None:
    corrupt = Timing(**{**_as_dict(timing), field: bad})
    assert takeover_timeout_s(corrupt, gap_steps=gap, floor_s=floor) == floor


@given(FULL_TIMINGS, STEPS, STEPS, FLOOR)
def test_takeover_timeout_grows_with_gap(timing: Timing, g1: int, g2: int, floor: float) -> None:
    low, high = sorted((g1, g2))
    assert takeover_timeout_s(timing, gap_steps=low, floor_s=floor) <= takeover_timeout_s(
        timing, gap_steps=high, floor_s=floor
    )


@given(TIMINGS, STEPS, FLOOR, st.none() | st.floats(0.0, 86_400.0))
def test_the_takeover_timeout_counts_a_fixed_grace_window(
    t: Timing, gap: int, floor: float, fixed: float | None
) -> None:
    """A leader holding a round open for the run's fixed window is not judged stuck for it:
    the run's timeout is the estimated one plus that window (none when adaptive)."""
    config = AlgorithmConfig(
        sync_every=100, fragments=4, takeover_floor_s=floor, grace_seconds=fixed
    )
    got = timing.takeover_after_s(t, config, gap)
    assert got == takeover_timeout_s(t, gap_steps=gap, floor_s=floor) + (fixed or 0.0)
    assert got >= timing.window_s(t, config, gap) if fixed is not None else got >= floor


def test_takeover_timeout_default_factor() -> None:
    timing = Timing(step_s=1.0, quorum_s=3.0, sync_s=1.0)
    assert takeover_timeout_s(timing, gap_steps=5, floor_s=10.0) == 27.0
    assert takeover_timeout_s(timing, gap_steps=5, floor_s=60.0) == 60.0


@given(
    st.floats(max_value=-1e-9) | st.just(math.nan) | st.just(math.inf), st.integers(max_value=-1)
)
def test_takeover_timeout_misuse_raises(bad: float, bad_gap: int) -> None:
    timing = Timing()
    with pytest.raises(ValueError, match="floor_s"):
        takeover_timeout_s(timing, gap_steps=1, floor_s=bad)
    with pytest.raises(ValueError, match="factor"):
        takeover_timeout_s(timing, gap_steps=1, floor_s=1.0, factor=bad)
    with pytest.raises(ValueError, match="gap_steps"):
        takeover_timeout_s(timing, gap_steps=bad_gap, floor_s=1.0)


honest_s = st.floats(min_value=1e-4, max_value=100.0)
any_report_s = st.one_of(st.just(0.0), st.floats(min_value=0.0, max_value=timing.MAX_ESTIMATE_S))


@given(honest=st.lists(honest_s, min_size=1, max_size=8), data=st.data())
def test_a_minority_of_step_reports_cannot_move_the_sample_outside_the_others(
    honest: list[float], data: st.DataObject
) -> None:
    liars = data.draw(st.lists(any_report_s, max_size=len(honest) - 1))
    reports = data.draw(st.permutations(honest + liars))
    sample = timing.step_sample(reports)
    if sample is not None:
        assert min(honest) <= sample <= max(honest)
    if 2 * len(honest) >= len(reports):
        assert sample is not None  # enough measured: there is a sample


@given(reports=st.lists(any_report_s, max_size=8))
def test_no_step_sample_while_fewer_than_half_are_measured(reports: list[float]) -> None:
    measured = [s for s in reports if s > 0.0]
    sample = timing.step_sample(reports)
    assert (sample is None) == (not measured or 2 * len(measured) < len(reports))
    assert sample is None or sample in measured
